// Prometheus' text exposition format (version 0.0.4, as prometheus.io's "Exposition formats"
// page defines it) read into samples, and the load of a vLLM-compatible server read from them:
// what the router learns from an OpenAI upstream's /metrics.
//
//   ASSIGN_OR_RETURN(std::vector<Sample> samples, ParsePrometheusText(body));
//   UpstreamLoad load = VllmLoad(samples);
//
// Pure functions; safe from any thread.
#ifndef KVSERVE_UPSTREAM_PROMETHEUS_TEXT_H_
#define KVSERVE_UPSTREAM_PROMETHEUS_TEXT_H_

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace kvserve::upstream {

struct Sample {
  std::string name;
  std::vector<std::pair<std::string, std::string>> labels;  // as written, escapes undone
  double value = 0;

  [[nodiscard]] const std::string* label(std::string_view key) const;
};

// Every sample line of `text` (comments and blank lines skipped; a timestamp after the value
// ignored). InvalidArgument naming the line for one that does not parse; at most `max_samples`
// samples (a hostile endpoint cannot make the router hold more).
absl::StatusOr<std::vector<Sample>> ParsePrometheusText(std::string_view text,
                                                        size_t max_samples = 100000);

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

#endif  // KVSERVE_UPSTREAM_PROMETHEUS_TEXT_H_
