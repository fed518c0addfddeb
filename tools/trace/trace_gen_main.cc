// kvserve-trace-gen: writes a generated traffic shape as a Mooncake JSONL trace
// (tools/trace/generate.h), to replay with kvserve-route-sim or kvserve-bench serve.
//
//   kvserve-trace-gen --shape agent --duration-s 600 --rate 0.5 --min-turns 10 --max-turns 30
//       --out agent.jsonl
#include <fstream>
#include <iostream>

#include "absl/flags/flag.h"
#include "common/init.h"
#include "common/status_macros.h"
#include "tools/trace/generate.h"

ABSL_FLAG(std::string, shape, "multi-turn", "multi-turn, agent or system-prompts");
ABSL_FLAG(std::string, out, "", "Where to write the trace (JSONL)");
ABSL_FLAG(double, duration_s, 600, "Arrivals over this many seconds");
ABSL_FLAG(double, rate, 1.0, "New sessions per second (system-prompts: requests per second)");
ABSL_FLAG(uint64_t, seed, 1, "Seed");
ABSL_FLAG(int32_t, block_size, 512, "Tokens per hash id");
ABSL_FLAG(int32_t, min_turns, 2, "multi-turn, agent: fewest turns in a session");
ABSL_FLAG(int32_t, max_turns, 8, "multi-turn, agent: most turns in a session");
ABSL_FLAG(int32_t, first_input, 2000, "multi-turn, agent: mean tokens of a session's first prompt");
ABSL_FLAG(int32_t, turn_input, 400, "multi-turn, agent: mean new tokens per turn");
ABSL_FLAG(int32_t, turn_output, 300, "multi-turn: mean answer tokens (agent: a quarter)");
ABSL_FLAG(double, think_s, 30, "multi-turn: mean seconds between turns (agent: at most 3)");
ABSL_FLAG(int32_t, system_prompts, 4, "system-prompts: distinct system prompts");
ABSL_FLAG(int32_t, system_prompt_len, 8192, "system-prompts: their length in tokens");
ABSL_FLAG(int32_t, question_len, 300, "system-prompts: mean question tokens");
ABSL_FLAG(int32_t, answer_len, 200, "system-prompts: mean answer tokens");

namespace kvserve::trace {
namespace {

absl::Status Main() {
  const std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) return absl::InvalidArgumentError("--out FILE is required");
  ASSIGN_OR_RETURN(std::vector<TraceRequest> t,
                   GenerateTrace({.shape = absl::GetFlag(FLAGS_shape),
                                  .duration_s = absl::GetFlag(FLAGS_duration_s),
                                  .rate = absl::GetFlag(FLAGS_rate),
                                  .seed = absl::GetFlag(FLAGS_seed),
                                  .block_size = absl::GetFlag(FLAGS_block_size),
                                  .min_turns = absl::GetFlag(FLAGS_min_turns),
                                  .max_turns = absl::GetFlag(FLAGS_max_turns),
                                  .turn_input = absl::GetFlag(FLAGS_turn_input),
                                  .turn_output = absl::GetFlag(FLAGS_turn_output),
                                  .think_s = absl::GetFlag(FLAGS_think_s),
                                  .first_input = absl::GetFlag(FLAGS_first_input),
                                  .system_prompts = absl::GetFlag(FLAGS_system_prompts),
                                  .system_prompt_len = absl::GetFlag(FLAGS_system_prompt_len),
                                  .question_len = absl::GetFlag(FLAGS_question_len),
                                  .answer_len = absl::GetFlag(FLAGS_answer_len)}));
  std::ofstream f(out);
  for (const TraceRequest& r : t) f << FormatTraceLine(r) << "\n";
  if (!f) return absl::UnavailableError("cannot write " + out);
  std::cout << "kvserve-trace-gen: " << t.size() << " requests to " << out << "\n";
  return absl::OkStatus();
}

}  // namespace
}  // namespace kvserve::trace

int main(int argc, char** argv) {
  kvserve::InitProgram(argc, argv, "kvserve-trace-gen: generated traffic shapes as traces");
  absl::Status s = kvserve::trace::Main();
  if (!s.ok()) {
    std::cerr << "kvserve-trace-gen: " << s.message() << "\n";
    return 1;
  }
  return 0;
}
