// The load of a vLLM-compatible server, read from its /metrics' samples
// (common/net/prometheus_text.h): what the bridge's heartbeats report.
//
//   ASSIGN_OR_RETURN(std::vector<Sample> samples, ParsePrometheusText(body));
//   UpstreamLoad load = VllmLoad(samples);
//
// Pure; safe from any thread.
#ifndef KVSERVE_UPSTREAM_VLLM_LOAD_H_
#define KVSERVE_UPSTREAM_VLLM_LOAD_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/net/prometheus_text.h"

namespace kvserve::upstream {

// A vLLM-compatible server's load, summed over its engines (vLLM labels each with `engine`
// under data parallelism); a field is unset when the server publishes none of its names.
struct UpstreamLoad {
  std::optional<double> running;          // vllm:num_requests_running
  std::optional<double> waiting;          // vllm:num_requests_waiting
  std::optional<double> kv_usage;         // vllm:kv_cache_usage_perc (before 0.10:
                                          // vllm:gpu_cache_usage_perc), 0..1, the engines' mean
  std::optional<int64_t> num_gpu_blocks;  // vllm:cache_config_info's labels, summed
  std::optional<int> block_size;          // the same, the first engine's
  std::optional<std::string> cache_dtype;
  std::optional<double> start_time;  // process_start_time_seconds: a new value, a new process
};
UpstreamLoad VllmLoad(const std::vector<Sample>& samples);

}  // namespace kvserve::upstream

#endif  // KVSERVE_UPSTREAM_VLLM_LOAD_H_
