// vLLM's load from its /metrics' samples (vllm_load.h).
#include "upstream/vllm_load.h"

#include "absl/strings/numbers.h"

namespace kvserve::upstream {

UpstreamLoad VllmLoad(const std::vector<Sample>& samples) {
  UpstreamLoad load;
  int usage_engines = 0;
  auto add = [](std::optional<double>& to, double v) { to = to.value_or(0) + v; };
  for (const Sample& s : samples) {
    if (s.name == "vllm:num_requests_running") add(load.running, s.value);
    if (s.name == "vllm:num_requests_waiting") add(load.waiting, s.value);
    if (s.name == "process_start_time_seconds" && !load.start_time) load.start_time = s.value;
    if (s.name == "vllm:kv_cache_usage_perc" || s.name == "vllm:gpu_cache_usage_perc") {
      add(load.kv_usage, s.value);
      ++usage_engines;
    }
    if (s.name == "vllm:cache_config_info") {
      int64_t blocks = 0;
      int block_size = 0;
      if (const std::string* b = s.label("num_gpu_blocks"); b && absl::SimpleAtoi(*b, &blocks)) {
        load.num_gpu_blocks = load.num_gpu_blocks.value_or(0) + blocks;
      }
      if (const std::string* b = s.label("block_size");
          b && !load.block_size && absl::SimpleAtoi(*b, &block_size) && block_size > 0) {
        load.block_size = block_size;
      }
      if (const std::string* d = s.label("cache_dtype"); d && !load.cache_dtype) {
        load.cache_dtype = *d;
      }
    }
  }
  if (usage_engines > 1) *load.kv_usage /= usage_engines;
  return load;
}

}  // namespace kvserve::upstream
