// The serving load generator behind `kvserve-bench serve`: sends a dataset of requests to a
// running router (OpenAI completions API, streamed) at a Poisson or unlimited rate with an
// optional concurrency cap, and reports vLLM's benchmark metrics: TTFT, TPOT, ITL and
// end-to-end latency (mean, p50, p90, p99), request and token throughput, goodput under SLOs,
// the prefix-cache hit rate the workers report (usage.prompt_tokens_details.cached_tokens over
// prompt tokens) and how many requests each worker got (from the router's /metrics).
//
// Datasets:
//   random          prompts of random token ids, --random-input-len / --random-output-len
//   shared-prefix   SGLang's generated-shared-prefix: --gsp-num-groups groups, each a system
//                   prompt of --gsp-system-prompt-len tokens shared by --gsp-prompts-per-group
//                   questions of --gsp-question-len tokens; --gsp-output-len output tokens;
//                   sent in a seeded random order. The report adds the hit rate one worker
//                   with an unlimited cache would reach on the same order (full blocks only).
//   multi-turn      conversations of --multi-turn-turns turns, each turn's prompt the whole
//                   history (previous prompts and answers) plus --multi-turn-input-len new
//                   tokens; a conversation's turns go in order, conversations concurrently.
//   trace           a Mooncake JSONL trace (tools/trace/trace.h; kvserve-trace-gen writes
//                   others): each request sent open loop at its timestamp / --trace-speedup,
//                   its prompt token ids derived from its hash ids (shared blocks share ids),
//                   its output the trace's (scaled, capped); --trace-window-* picks a slice.
//                   The report adds the routing decisions by reason and the spread of requests
//                   over the workers.
//
//   ASSIGN_OR_RETURN(nlohmann::json report, RunServing(options));
#ifndef KVSERVE_TOOLS_BENCH_SERVING_H_
#define KVSERVE_TOOLS_BENCH_SERVING_H_

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace kvserve::bench {

struct ServingOptions {
  // The router, or several comma-separated (router replicas): sessions go to each in turn, as a
  // round-robin balancer sends them, and the routers' counters are summed.
  std::string url = "http://127.0.0.1:8000";
  std::string model;  // empty: the first of GET /v1/models
  std::string dataset = "random";
  int num_prompts = 64;  // random; multi-turn: conversations × turns
  double request_rate = std::numeric_limits<double>::infinity();  // requests/s, Poisson
  int max_concurrency = 0;                                        // 0: no cap
  uint64_t seed = 1;
  int vocab_size = 32000;  // prompt token ids are drawn from [100, vocab_size)
  int block_size = 16;     // for the ideal hit rate of shared-prefix
  int random_input_len = 256, random_output_len = 32;
  // Send each prompt as text, one English word per token id, for the router to tokenize
  // (the prompt's token count then differs a little from its ids').
  bool text_prompts = false;
  // Reuse kept-alive connections between requests (as SDKs and load balancers do); else a
  // new connection per request.
  bool keep_alive = true;
  int gsp_num_groups = 16, gsp_prompts_per_group = 4, gsp_system_prompt_len = 512,
      gsp_question_len = 32, gsp_output_len = 16;
  int multi_turn_conversations = 8, multi_turn_turns = 4, multi_turn_input_len = 64,
      multi_turn_output_len = 16;
  std::string trace_file;
  int trace_block_size = 512;
  double trace_speedup = 1.0;
  double trace_window_start_s = 0, trace_window_end_s = 1e12;
  double trace_output_scale = 1.0;
  int trace_max_output = 0;  // 0: no cap
  // Spread requests sharing a timestamp over up to this many ms (trace::SpreadArrivals; 0: not).
  int64_t trace_spread_arrivals_ms = 0;
  // SLOs for goodput, in milliseconds (0: not constrained).
  double slo_ttft_ms = 0, slo_tpot_ms = 0, slo_e2e_ms = 0;
};

// InvalidArgument for bad options; Unavailable when the router cannot be reached. Failed
// requests are counted in the report (with their first errors), not returned as errors.
absl::StatusOr<nlohmann::json> RunServing(const ServingOptions& options);

// The report as a vLLM-style summary table.
std::string FormatServingReport(const nlohmann::json& report);

}  // namespace kvserve::bench

#endif  // KVSERVE_TOOLS_BENCH_SERVING_H_
