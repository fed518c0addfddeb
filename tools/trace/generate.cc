#include "tools/trace/generate.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"

namespace kvserve::trace {
namespace {

// A growing context: the ids of its full blocks, and how many tokens its partial block holds.
struct Context {
  std::vector<int64_t> full;
  int64_t tokens = 0;
};

class Generator {
 public:
  explicit Generator(const ShapeOptions& o) : o_(o), rng_(o.seed) {}

  // Appends `n` tokens to `c` (its partial block is rewritten: a new id once it changes).
  void Grow(Context& c, int64_t n) {
    c.tokens += n;
    while (static_cast<int64_t>(c.full.size()) < c.tokens / o_.block_size)
      c.full.push_back(next_id_++);
  }
  // The request that sends context `c` at `t_ms`.
  TraceRequest Request(const Context& c, double t_ms, int64_t output) {
    TraceRequest r{.timestamp_ms = static_cast<int64_t>(t_ms),
                   .input_length = c.tokens,
                   .output_length = output,
                   .hash_ids = c.full};
    if (c.tokens % o_.block_size != 0) r.hash_ids.push_back(next_id_++);
    return r;
  }
  double Exp(double mean) { return std::exponential_distribution<double>(1.0 / mean)(rng_); }
  int Uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  // Around `mean`: a gamma spread of shape 4 (lengths vary by about half their mean).
  int64_t Around(int mean) {
    return std::max<int64_t>(1,
                             std::llround(std::gamma_distribution<double>(4.0, mean / 4.0)(rng_)));
  }

  // Sessions arriving at `rate`; each a first prompt then turns that append the answer and a
  // new input after a think time.
  std::vector<TraceRequest> Sessions(int first_input, int turn_input, int turn_output,
                                     double think_s) {
    std::vector<TraceRequest> out;
    for (double t = Exp(1.0 / o_.rate); t < o_.duration_s; t += Exp(1.0 / o_.rate)) {
      Context c;
      Grow(c, Around(first_input));
      double at = t;
      const int turns = Uniform(o_.min_turns, o_.max_turns);
      for (int k = 0; k < turns; ++k) {
        const int64_t answer = Around(turn_output);
        out.push_back(Request(c, at * 1000, answer));
        Grow(c, answer + Around(turn_input));
        at += think_s > 0 ? Exp(think_s) : 0;
      }
    }
    return out;
  }

  std::vector<TraceRequest> SystemPrompts() {
    std::vector<Context> systems(o_.system_prompts);
    for (Context& s : systems) Grow(s, o_.system_prompt_len - o_.system_prompt_len % o_.block_size);
    std::vector<TraceRequest> out;
    for (double t = Exp(1.0 / o_.rate); t < o_.duration_s; t += Exp(1.0 / o_.rate)) {
      Context c = systems[Uniform(0, o_.system_prompts - 1)];
      Grow(c, Around(o_.question_len));
      out.push_back(Request(c, t * 1000, Around(o_.answer_len)));
    }
    return out;
  }

 private:
  const ShapeOptions& o_;
  std::mt19937_64 rng_;
  int64_t next_id_ = 0;
};

}  // namespace

absl::StatusOr<std::vector<TraceRequest>> GenerateTrace(const ShapeOptions& o) {
  if (!(o.duration_s > 0) || !(o.rate > 0) || o.block_size < 1 || o.min_turns < 1 ||
      o.max_turns < o.min_turns || o.turn_input < 1 || o.turn_output < 1 || o.first_input < 1 ||
      o.system_prompts < 1 || o.system_prompt_len < o.block_size || o.question_len < 1 ||
      o.answer_len < 1 || o.think_s < 0) {
    return absl::InvalidArgumentError(
        "trace shape options out of range: durations, rates and lengths must be > 0, "
        "max turns >= min turns >= 1, the system prompt at least one block");
  }
  Generator g(o);
  std::vector<TraceRequest> out;
  if (o.shape == "multi-turn") {
    out = g.Sessions(o.first_input, o.turn_input, o.turn_output, o.think_s);
  } else if (o.shape == "agent") {
    // Tool results of about turn_input tokens, calls of a quarter of turn_output, a few
    // seconds of tool latency: the context grows fast and is resent at once.
    out = g.Sessions(o.first_input, o.turn_input, std::max(1, o.turn_output / 4),
                     std::min(o.think_s, 3.0));
  } else if (o.shape == "system-prompts") {
    out = g.SystemPrompts();
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--shape '", o.shape, "' is not one of multi-turn, agent, system-prompts"));
  }
  std::stable_sort(out.begin(), out.end(), [](const TraceRequest& a, const TraceRequest& b) {
    return a.timestamp_ms < b.timestamp_ms;
  });
  return out;
}

}  // namespace kvserve::trace
