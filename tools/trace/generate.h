// Traffic shapes the public traces lack, written in the same Mooncake JSONL format (trace.h) so
// that any shape replays the same way (kvserve-route-sim, kvserve-bench serve --dataset trace):
//   multi-turn      chat sessions whose every turn resends the whole history (previous prompts
//                   and answers) plus a new message, after a think time;
//   agent           agent loops: many quick iterations, each appending a tool result to the
//                   context and producing a short call;
//   system-prompts  many users on a few long system prompts, each request one system prompt and
//                   a question of its own.
// A block's hash id is reused exactly when its tokens would be: a context's full blocks keep
// their ids in its next request, its last partial block does not.
//
//   ASSIGN_OR_RETURN(std::vector<TraceRequest> t, GenerateTrace({.shape = "agent"}));
//
// Deterministic for a seed; any thread.
#ifndef KVSERVE_TOOLS_TRACE_GENERATE_H_
#define KVSERVE_TOOLS_TRACE_GENERATE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tools/trace/trace.h"

namespace kvserve::trace {

struct ShapeOptions {
  std::string shape = "multi-turn";
  double duration_s = 600;  // arrivals of sessions (or requests) over this long
  double rate = 1.0;        // new sessions per second (system-prompts: requests per second)
  uint64_t seed = 1;
  int block_size = 512;
  // multi-turn and agent: turns per session (uniform in [min, max]), new tokens per turn,
  // output tokens per turn, seconds between a turn's answer and the next turn.
  int min_turns = 2, max_turns = 8;
  int turn_input = 400, turn_output = 300;
  double think_s = 30;
  int first_input = 2000;  // the first turn's prompt (a system prompt and the first message)
  // system-prompts: how many distinct system prompts, their length, the questions' length.
  int system_prompts = 4, system_prompt_len = 8192, question_len = 300, answer_len = 200;
};

// InvalidArgument naming the shape or option that is out of range.
absl::StatusOr<std::vector<TraceRequest>> GenerateTrace(const ShapeOptions& options);

}  // namespace kvserve::trace

#endif  // KVSERVE_TOOLS_TRACE_GENERATE_H_
