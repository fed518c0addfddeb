#include "tools/bench/serving.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <map>
#include <random>
#include <regex>
#include <sstream>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "boost/beast/http.hpp"
#include "common/net/http_client.h"
#include "common/status_macros.h"
#include "tools/trace/trace.h"

namespace kvserve::bench {
namespace {

namespace http = boost::beast::http;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// One request of the workload. A session's requests are sent one after the other (multi-turn);
// every other dataset has one request per session.
struct Turn {
  std::vector<int> new_ids;  // appended to the session's history
  int max_tokens = 16;
  double at_s = 0;  // trace: when to send it, from the run's start
};
using Session = std::vector<Turn>;

struct Result {
  bool ok = false;
  std::string error;
  double ttft = 0, e2e = 0;
  std::vector<double> itl;
  int prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
};

std::vector<int> RandomIds(int n, int vocab, std::mt19937_64& rng) {
  std::uniform_int_distribution<int> d(100, vocab - 1);
  std::vector<int> ids(n);
  for (int& id : ids) id = d(rng);
  return ids;
}

// Sessions in sending order, and for shared-prefix the ideal hit tokens.
std::vector<Session> MakeWorkload(const ServingOptions& o, int64_t* ideal_hit,
                                  int64_t* ideal_prompt) {
  std::mt19937_64 rng(o.seed);
  std::vector<Session> sessions;
  *ideal_hit = *ideal_prompt = 0;
  if (o.dataset == "random") {
    for (int i = 0; i < o.num_prompts; ++i) {
      sessions.push_back({{RandomIds(o.random_input_len, o.vocab_size, rng), o.random_output_len}});
    }
  } else if (o.dataset == "shared-prefix") {
    std::vector<std::vector<int>> prompts;
    for (int g = 0; g < o.gsp_num_groups; ++g) {
      const std::vector<int> system = RandomIds(o.gsp_system_prompt_len, o.vocab_size, rng);
      for (int q = 0; q < o.gsp_prompts_per_group; ++q) {
        std::vector<int> p = system;
        const std::vector<int> question = RandomIds(o.gsp_question_len, o.vocab_size, rng);
        p.insert(p.end(), question.begin(), question.end());
        prompts.push_back(std::move(p));
      }
    }
    std::shuffle(prompts.begin(), prompts.end(), rng);
    // One worker, unlimited cache, requests in this order: each prompt hits the full blocks of
    // its longest common prefix with any earlier prompt (never its last token).
    for (size_t i = 0; i < prompts.size(); ++i) {
      size_t best = 0;
      for (size_t j = 0; j < i; ++j) {
        size_t n = 0;
        while (n < prompts[i].size() && n < prompts[j].size() && prompts[i][n] == prompts[j][n])
          ++n;
        best = std::max(best, n);
      }
      best = std::min(best, prompts[i].size() - 1);
      *ideal_hit += static_cast<int64_t>(best / o.block_size * o.block_size);
      *ideal_prompt += static_cast<int64_t>(prompts[i].size());
      sessions.push_back({{prompts[i], o.gsp_output_len}});
    }
  } else {  // multi-turn
    for (int c = 0; c < o.multi_turn_conversations; ++c) {
      Session s;
      for (int t = 0; t < o.multi_turn_turns; ++t) {
        s.push_back(
            {RandomIds(o.multi_turn_input_len, o.vocab_size, rng), o.multi_turn_output_len});
      }
      sessions.push_back(std::move(s));
    }
  }
  return sessions;
}

// The trace's requests in the window, each a session of one turn with its send time.
absl::StatusOr<std::vector<Session>> TraceWorkload(const ServingOptions& o) {
  ASSIGN_OR_RETURN(std::vector<trace::TraceRequest> requests,
                   trace::ReadTrace(o.trace_file, o.trace_block_size));
  if (o.trace_spread_arrivals_ms > 0) {
    requests = trace::SpreadArrivals(std::move(requests), o.trace_spread_arrivals_ms, 1);
  }
  const auto start_ms = static_cast<int64_t>(o.trace_window_start_s * 1000);
  const auto end_ms = static_cast<int64_t>(std::min(o.trace_window_end_s, 1e12) * 1000);
  std::vector<Session> sessions;
  for (const trace::TraceRequest& r : trace::Window(requests, start_ms, end_ms)) {
    const std::vector<int32_t> ids = trace::TracePrompt(
        r, {.block_size = o.trace_block_size, .min_token = 100, .max_token = o.vocab_size});
    int64_t out = std::llround(static_cast<double>(r.output_length) * o.trace_output_scale);
    if (o.trace_max_output > 0) out = std::min<int64_t>(out, o.trace_max_output);
    Turn t{.new_ids = std::vector<int>(ids.begin(), ids.end()),
           .max_tokens = static_cast<int>(std::max<int64_t>(1, out)),
           .at_s = static_cast<double>(r.timestamp_ms - start_ms) / 1000.0 / o.trace_speedup};
    sessions.push_back({std::move(t)});
  }
  return sessions;
}

// A counting gate for --max-concurrency.
class Gate {
 public:
  explicit Gate(int limit) : limit_(limit) {}
  void Enter() ABSL_LOCKS_EXCLUDED(mu_) {
    if (limit_ <= 0) return;
    absl::MutexLock lock(&mu_);
    while (inside_ >= limit_) cv_.Wait(&mu_);
    ++inside_;
  }
  void Leave() ABSL_LOCKS_EXCLUDED(mu_) {
    if (limit_ <= 0) return;
    absl::MutexLock lock(&mu_);
    --inside_;
    cv_.Signal();
  }

 private:
  const int limit_;
  absl::Mutex mu_;
  absl::CondVar cv_;  // signalled when one leaves
  int inside_ ABSL_GUARDED_BY(mu_) = 0;
};

// The results of every session's thread.
class ResultLog {
 public:
  void Add(Result r) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    results_.push_back(std::move(r));
  }
  // Once the threads are joined.
  std::vector<Result> Take() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return std::move(results_);
  }

 private:
  absl::Mutex mu_;
  std::vector<Result> results_ ABSL_GUARDED_BY(mu_);
};

// A prompt's ids as text: a common English word per id.
std::string AsText(const std::vector<int>& ids) {
  static constexpr std::string_view kWords[] = {
      "the",   "of",   "and",    "to",   "in",      "is",    "that",  "for",   "it",    "as",
      "with",  "was",  "on",     "be",   "by",      "at",    "this",  "from",  "or",    "an",
      "which", "one",  "all",    "were", "their",   "there", "been",  "has",   "when",  "who",
      "more",  "no",   "if",     "out",  "so",      "said",  "what",  "up",    "its",   "about",
      "into",  "than", "them",   "can",  "only",    "other", "new",   "some",  "could", "time",
      "these", "two",  "may",    "then", "do",      "first", "any",   "my",    "now",   "such",
      "like",  "our",  "over",   "man",  "me",      "even",  "most",  "made",  "after", "also",
      "did",   "many", "before", "must", "through", "back",  "years", "where", "much",  "your"};
  std::string text;
  for (int id : ids) {
    if (!text.empty()) text += ' ';
    text += kWords[static_cast<size_t>(id) % std::size(kWords)];
  }
  return text;
}

// Sends one streamed completion and times it from the server-sent events.
Result SendOne(const Endpoint& ep, HttpConnectionPool* pool, const std::string& model,
               const std::vector<int>& prompt, bool text_prompt, int max_tokens,
               std::string* answer) {
  Result r;
  const json body = {{"model", model},
                     {"prompt", text_prompt ? json(AsText(prompt)) : json(prompt)},
                     {"max_tokens", max_tokens},
                     {"temperature", 0},
                     {"ignore_eos", true},
                     {"stream", true},
                     {"stream_options", {{"include_usage", true}}}};
  const auto start = Clock::now();
  auto last = start;
  bool first = true;
  std::string pending, error_body;
  auto on_event = [&](const std::string& data) {
    if (data == "[DONE]") return;
    const json j = json::parse(data, nullptr, false);
    if (j.is_discarded()) return;
    if (j.contains("error")) {
      r.error = j["error"].value("message", "error event");
      return;
    }
    if (j.contains("usage") && j["usage"].is_object()) {
      const json& u = j["usage"];
      r.prompt_tokens = u.value("prompt_tokens", 0);
      r.completion_tokens = u.value("completion_tokens", 0);
      if (u.contains("prompt_tokens_details") && u["prompt_tokens_details"].is_object()) {
        r.cached_tokens = u["prompt_tokens_details"].value("cached_tokens", 0);
      }
    }
    if (!j.contains("choices") || j["choices"].empty()) return;
    const std::string text = j["choices"][0].value("text", "");
    if (text.empty()) return;
    const auto now = Clock::now();
    if (first) {
      r.ttft = std::chrono::duration<double>(now - start).count();
      first = false;
    } else {
      r.itl.push_back(std::chrono::duration<double>(now - last).count());
    }
    last = now;
    if (answer != nullptr) answer->append(text);
  };
  absl::StatusOr<int> status =
      Exchange(ep, http::verb::post, "/v1/completions", body.dump(),
               [&](std::string_view s) {
                 pending.append(s);
                 size_t end;
                 while ((end = pending.find("\n\n")) != std::string::npos) {
                   const std::string event = pending.substr(0, end);
                   pending.erase(0, end + 2);
                   if (event.rfind("data: ", 0) == 0) on_event(event.substr(6));
                 }
               },
               {.pool = pool});
  r.e2e = std::chrono::duration<double>(Clock::now() - start).count();
  if (!status.ok()) {
    r.error = std::string(status.status().message());
  } else if (*status != 200) {
    r.error = absl::StrCat("HTTP ", *status, ": ", pending.substr(0, 300));
  } else if (r.error.empty() && first) {
    // Tokens whose text never completed (bytes of a character held back): the request still
    // succeeded; its first token is dated at the end, as nothing earlier showed it.
    if (r.completion_tokens > 0) {
      r.ttft = r.e2e;
    } else {
      r.error = "no token streamed";
    }
  }
  r.ok = r.error.empty();
  return r;
}

// A counter of the routers' Prometheus text with one label, by that label's value, summed over
// the routers: kvserve_router_routed_total by worker, kvserve_router_decisions_total by reason.
std::map<std::string, double> RouterCounter(const std::vector<Endpoint>& routers,
                                            const std::string& metric, const std::string& label) {
  std::map<std::string, double> out;
  const std::regex re(metric + R"re(\{)re" + label + R"re(="([^"]*)"\} ([0-9.e+]+))re");
  for (const Endpoint& ep : routers) {
    absl::StatusOr<std::string> text = Fetch(ep, http::verb::get, "/metrics");
    if (!text.ok()) continue;
    for (std::sregex_iterator it(text->begin(), text->end(), re), end; it != end; ++it) {
      out[(*it)[1]] += std::stod((*it)[2]);
    }
  }
  return out;
}

// What a counter gained between two readings.
json CounterDelta(const std::map<std::string, double>& before,
                  const std::map<std::string, double>& after) {
  json delta = json::object();
  for (const auto& [name, n] : after) {
    const auto it = before.find(name);
    delta[name] = static_cast<int64_t>(n - (it == before.end() ? 0.0 : it->second));
  }
  return delta;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const double rank = p / 100.0 * (v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank)), hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (rank - lo);
}

void AddStats(json& report, const std::string& name, const std::vector<double>& seconds) {
  double sum = 0;
  for (double s : seconds) sum += s;
  report["mean_" + name + "_ms"] = seconds.empty() ? 0.0 : 1e3 * sum / seconds.size();
  report["median_" + name + "_ms"] = 1e3 * Percentile(seconds, 50);
  report["p90_" + name + "_ms"] = 1e3 * Percentile(seconds, 90);
  report["p99_" + name + "_ms"] = 1e3 * Percentile(seconds, 99);
}

absl::Status Validate(const ServingOptions& o) {
  if (o.dataset != "random" && o.dataset != "shared-prefix" && o.dataset != "multi-turn" &&
      o.dataset != "trace") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--dataset '", o.dataset, "' is not one of random, shared-prefix, multi-turn, trace"));
  }
  if ((o.dataset == "trace") != !o.trace_file.empty()) {
    return absl::InvalidArgumentError("--trace-file FILE goes with --dataset trace, and only");
  }
  const ServingOptions unset;
  if (o.dataset != "trace" &&
      (o.trace_block_size != unset.trace_block_size || o.trace_speedup != unset.trace_speedup ||
       o.trace_window_start_s != unset.trace_window_start_s ||
       o.trace_window_end_s != unset.trace_window_end_s ||
       o.trace_output_scale != unset.trace_output_scale ||
       o.trace_max_output != unset.trace_max_output ||
       o.trace_spread_arrivals_ms != unset.trace_spread_arrivals_ms)) {
    return absl::InvalidArgumentError("the --trace-* flags go with --dataset trace, and only");
  }
  if (!(o.trace_speedup > 0) || !(o.trace_output_scale > 0) || o.trace_max_output < 0 ||
      o.trace_block_size < 1 || o.trace_spread_arrivals_ms < 0) {
    return absl::InvalidArgumentError(
        "--trace-speedup and --trace-output-scale must be > 0, --trace-max-output and "
        "--trace-spread-arrivals-ms >= 0, --trace-block-size >= 1");
  }
  if (!(o.request_rate > 0))
    return absl::InvalidArgumentError("--request-rate must be > 0 (inf: all at once)");
  if (o.max_concurrency < 0) return absl::InvalidArgumentError("--max-concurrency must be >= 0");
  if (o.vocab_size <= 100) return absl::InvalidArgumentError("--vocab-size must be > 100");
  if (o.block_size <= 0) return absl::InvalidArgumentError("--block-size must be > 0");
  for (auto [name, v] : {std::pair{"--num-prompts", o.num_prompts},
                         {"--random-input-len", o.random_input_len},
                         {"--random-output-len", o.random_output_len},
                         {"--gsp-num-groups", o.gsp_num_groups},
                         {"--gsp-prompts-per-group", o.gsp_prompts_per_group},
                         {"--gsp-system-prompt-len", o.gsp_system_prompt_len},
                         {"--gsp-question-len", o.gsp_question_len},
                         {"--gsp-output-len", o.gsp_output_len},
                         {"--multi-turn-conversations", o.multi_turn_conversations},
                         {"--multi-turn-turns", o.multi_turn_turns},
                         {"--multi-turn-input-len", o.multi_turn_input_len},
                         {"--multi-turn-output-len", o.multi_turn_output_len}}) {
    if (v <= 0) return absl::InvalidArgumentError(absl::StrCat(name, " must be > 0, got ", v));
  }
  return absl::OkStatus();
}

// The model to ask for: --model, or the first one GET /v1/models lists.
absl::StatusOr<std::string> ServedModel(const ServingOptions& o, const Endpoint& ep) {
  if (!o.model.empty()) return o.model;
  absl::StatusOr<std::string> models = Fetch(ep, http::verb::get, "/v1/models");
  if (!models.ok()) return models.status();
  const json j = json::parse(*models, nullptr, false);
  if (j.is_discarded() || !j.contains("data") || j["data"].empty()) {
    return absl::UnavailableError("GET /v1/models listed no model");
  }
  return j["data"][0].value("id", "");
}

// One session's turns in order, each prompt the history so far; an answer joins the history as
// the router tokenizes it (no BOS). Stops at the first failure.
void RunSession(const Endpoint& ep, HttpConnectionPool* pool, const std::string& model,
                bool text_prompts, const Session& session, Gate& gate, ResultLog& log) {
  std::vector<int> history;
  for (const Turn& turn : session) {
    history.insert(history.end(), turn.new_ids.begin(), turn.new_ids.end());
    std::string answer;
    gate.Enter();
    Result r = SendOne(ep, pool, model, history, text_prompts, turn.max_tokens,
                       session.size() > 1 ? &answer : nullptr);
    gate.Leave();
    const bool ok = r.ok;
    log.Add(std::move(r));
    if (!ok) return;
    if (session.size() <= 1 || answer.empty()) continue;
    absl::StatusOr<std::string> t =
        Fetch(ep, http::verb::post, "/tokenize",
              json{{"model", model}, {"prompt", answer}, {"add_special_tokens", false}}.dump(),
              {.pool = pool});
    if (!t.ok()) {
      Result failed;
      failed.error = std::string(t.status().message());
      log.Add(std::move(failed));
      return;
    }
    const json ids = json::parse(*t, nullptr, false).value("tokens", json::array());
    for (const json& id : ids) history.push_back(id.get<int>());
  }
}

// vLLM's serving metrics over the results: counts, throughputs, latency statistics, goodput
// under the SLOs, the prefix-cache hit rate.
json Summarize(const ServingOptions& o, const std::vector<Result>& results, double duration) {
  json report;
  std::vector<double> ttft, tpot, itl, e2e;
  int64_t input = 0, output = 0, cached = 0, good = 0;
  json errors = json::array();
  int completed = 0;
  for (const Result& r : results) {
    if (!r.ok) {
      if (errors.size() < 5) errors.push_back(r.error);
      continue;
    }
    ++completed;
    input += r.prompt_tokens;
    output += r.completion_tokens;
    cached += r.cached_tokens;
    ttft.push_back(r.ttft);
    e2e.push_back(r.e2e);
    itl.insert(itl.end(), r.itl.begin(), r.itl.end());
    const double t = r.completion_tokens > 1 ? (r.e2e - r.ttft) / (r.completion_tokens - 1) : 0.0;
    if (r.completion_tokens > 1) tpot.push_back(t);
    const bool meets = (o.slo_ttft_ms <= 0 || 1e3 * r.ttft <= o.slo_ttft_ms) &&
                       (o.slo_tpot_ms <= 0 || 1e3 * t <= o.slo_tpot_ms) &&
                       (o.slo_e2e_ms <= 0 || 1e3 * r.e2e <= o.slo_e2e_ms);
    if (meets) ++good;
  }
  report["duration"] = duration;
  report["completed"] = completed;
  report["failed"] = static_cast<int>(results.size()) - completed;
  report["errors"] = errors;
  report["total_input_tokens"] = input;
  report["total_output_tokens"] = output;
  report["request_throughput"] = completed / duration;
  report["request_goodput"] = good / duration;
  report["output_throughput"] = output / duration;
  report["total_token_throughput"] = (input + output) / duration;
  AddStats(report, "ttft", ttft);
  AddStats(report, "tpot", tpot);
  AddStats(report, "itl", itl);
  AddStats(report, "e2el", e2e);
  report["cached_prompt_tokens"] = cached;
  report["prefix_cache_hit_rate"] = input > 0 ? static_cast<double>(cached) / input : 0.0;
  return report;
}

}  // namespace

absl::StatusOr<json> RunServing(const ServingOptions& o) {
  if (absl::Status s = Validate(o); !s.ok()) return s;
  std::vector<Endpoint> routers;
  for (absl::string_view url : absl::StrSplit(o.url, ',')) {
    ASSIGN_OR_RETURN(Endpoint ep, ParseUrl(std::string(url)));
    routers.push_back(std::move(ep));
  }
  absl::StatusOr<std::string> model = ServedModel(o, routers[0]);
  if (!model.ok()) return model.status();
  int64_t ideal_hit = 0, ideal_prompt = 0;
  std::vector<Session> sessions;
  if (o.dataset == "trace") {
    ASSIGN_OR_RETURN(sessions, TraceWorkload(o));
  } else {
    sessions = MakeWorkload(o, &ideal_hit, &ideal_prompt);
  }
  const auto routed_before = RouterCounter(routers, "kvserve_router_routed_total", "worker");
  const auto reasons_before = RouterCounter(routers, "kvserve_router_decisions_total", "reason");

  ResultLog log;
  Gate gate(o.max_concurrency);
  // Kept-alive connections, as an SDK's client pools them (--keep-alive); none: one each.
  HttpConnectionPool connections;
  HttpConnectionPool* pool = o.keep_alive ? &connections : nullptr;
  std::vector<std::thread> threads;
  std::mt19937_64 arrivals(o.seed ^ 0x5eedULL);
  std::exponential_distribution<double> gap(std::isinf(o.request_rate) ? 1.0 : o.request_rate);
  const auto start = Clock::now();
  auto next = start;
  for (size_t k = 0; k < sessions.size(); ++k) {
    const Session& session = sessions[k];
    const Endpoint& ep = routers[k % routers.size()];
    if (o.dataset == "trace") {
      std::this_thread::sleep_until(start + std::chrono::duration_cast<Clock::duration>(
                                                std::chrono::duration<double>(session[0].at_s)));
    } else if (!std::isinf(o.request_rate)) {
      next +=
          std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(gap(arrivals)));
      std::this_thread::sleep_until(next);
    }
    threads.emplace_back(
        [&, session] { RunSession(ep, pool, *model, o.text_prompts, session, gate, log); });
  }
  for (std::thread& t : threads) t.join();
  const double duration = std::chrono::duration<double>(Clock::now() - start).count();
  const auto routed_after = RouterCounter(routers, "kvserve_router_routed_total", "worker");
  const auto reasons_after = RouterCounter(routers, "kvserve_router_decisions_total", "reason");

  json report = Summarize(o, log.Take(), duration);
  if (pool != nullptr) report["connections_opened"] = connections.opened();
  report["dataset"] = o.dataset;
  report["model"] = *model;
  report["url"] = o.url;
  report["request_rate"] = std::isinf(o.request_rate) ? json("inf") : json(o.request_rate);
  report["max_concurrency"] = o.max_concurrency;
  if (o.dataset == "shared-prefix") {
    report["ideal_prefix_cache_hit_rate"] =
        ideal_prompt > 0 ? static_cast<double>(ideal_hit) / ideal_prompt : 0.0;
  }
  report["requests_per_worker"] = CounterDelta(routed_before, routed_after);
  report["decisions"] = CounterDelta(reasons_before, reasons_after);
  return report;
}

std::string FormatServingReport(const json& r) {
  std::ostringstream out;
  auto line = [&](const std::string& name, const std::string& value) {
    out << absl::StrFormat("%-40s %s\n", name, value);
  };
  auto num = [&](const char* key, int digits = 2) {
    return r.contains(key) ? absl::StrFormat("%.*f", digits, r[key].get<double>()) : "-";
  };
  out << "============ Serving Benchmark Result ============\n";
  line("Dataset:", r["dataset"].get<std::string>());
  line("Successful requests:", std::to_string(r["completed"].get<int>()));
  line("Failed requests:", std::to_string(r["failed"].get<int>()));
  line("Benchmark duration (s):", num("duration"));
  line("Total input tokens:", std::to_string(r["total_input_tokens"].get<int64_t>()));
  line("Total generated tokens:", std::to_string(r["total_output_tokens"].get<int64_t>()));
  line("Request throughput (req/s):", num("request_throughput"));
  line("Request goodput (req/s):", num("request_goodput"));
  line("Output token throughput (tok/s):", num("output_throughput"));
  line("Total token throughput (tok/s):", num("total_token_throughput"));
  line("Prefix cache hit rate:", num("prefix_cache_hit_rate", 4));
  if (r.contains("ideal_prefix_cache_hit_rate")) {
    line("Ideal hit rate (one unlimited cache):", num("ideal_prefix_cache_hit_rate", 4));
  }
  for (const char* m : {"ttft", "tpot", "itl", "e2el"}) {
    out << absl::StrFormat("---------------- %s ----------------\n", m);
    for (const char* stat : {"mean", "median", "p90", "p99"}) {
      const std::string key = absl::StrCat(stat, "_", m, "_ms");
      line(absl::StrCat(stat, " ", m, " (ms):"), num(key.c_str()));
    }
  }
  out << "---------------- requests per worker ----------------\n";
  for (const auto& [name, n] : r["requests_per_worker"].items()) line(name, n.dump());
  if (r.contains("decisions")) {
    out << "---------------- routing decisions ----------------\n";
    for (const auto& [reason, n] : r["decisions"].items()) line(reason, n.dump());
  }
  for (const auto& e : r["errors"]) out << "error: " << e.get<std::string>() << "\n";
  out << "==================================================\n";
  return out.str();
}

}  // namespace kvserve::bench
