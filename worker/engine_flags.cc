#include "worker/engine_flags.h"

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"

ABSL_FLAG(std::string, model, "", "Model directory (Hugging Face layout: config.json, *.safetensors)");
ABSL_FLAG(std::string, hf_config, "", "config.json to use instead of MODEL/config.json");
ABSL_FLAG(std::string, served_model_name, "", "Model id in the block-hash key (default: the directory name)");
ABSL_FLAG(std::string, device, "cpu", "Backend: cpu (cuda arrives with the CUDA backend)");
ABSL_FLAG(int32_t, block_size, 16, "Tokens per KV block: 8, 16 or 32");
ABSL_FLAG(int32_t, max_num_seqs, 256, "Most sequences in one batch");
ABSL_FLAG(int32_t, max_num_batched_tokens, 2048, "Token budget of one engine step");
ABSL_FLAG(int32_t, max_model_len, 0, "Longest prompt + output (0: the model's max_position_embeddings)");
ABSL_FLAG(bool, enable_prefix_caching, true, "Share KV blocks of identical prefixes");
ABSL_FLAG(double, kv_cache_memory_gib, 0.5, "KV pool size in GiB (CPU backend)");
ABSL_FLAG(int32_t, num_blocks, 0, "KV pool size in blocks (overrides --kv-cache-memory-gib)");
ABSL_FLAG(int32_t, cpu_threads, 1, "Threads for the CPU backend's GEMMs");
ABSL_FLAG(int32_t, long_prefill_token_threshold, 0,
          "Prompts longer than this are long: they prefill at most this many tokens per step "
          "(0: off)");
ABSL_FLAG(int32_t, max_num_partial_prefills, 0, "Most prefilling sequences per step (0: no cap)");
ABSL_FLAG(int32_t, max_long_partial_prefills, 1, "Most long prompts prefilling at once");

namespace kvserve::worker {

absl::StatusOr<EngineConfig> EngineConfigFromFlags() {
  EngineConfig c;
  c.model_dir = absl::GetFlag(FLAGS_model);
  if (c.model_dir.empty()) return absl::InvalidArgumentError("--model DIR is required");
  const std::string device = absl::GetFlag(FLAGS_device);
  if (device != "cpu") {
    return absl::InvalidArgumentError(
        absl::StrCat("--device ", device, " is not available in this build (cpu)"));
  }
  c.config_path = absl::GetFlag(FLAGS_hf_config);
  c.model_id = absl::GetFlag(FLAGS_served_model_name);
  c.block_size = absl::GetFlag(FLAGS_block_size);
  c.max_model_len = absl::GetFlag(FLAGS_max_model_len);
  c.enable_prefix_caching = absl::GetFlag(FLAGS_enable_prefix_caching);
  c.kv_cache_memory_gib = absl::GetFlag(FLAGS_kv_cache_memory_gib);
  c.num_blocks = absl::GetFlag(FLAGS_num_blocks);
  c.cpu_threads = absl::GetFlag(FLAGS_cpu_threads);
  c.scheduler.max_num_seqs = absl::GetFlag(FLAGS_max_num_seqs);
  c.scheduler.max_num_batched_tokens = absl::GetFlag(FLAGS_max_num_batched_tokens);
  c.scheduler.long_prefill_token_threshold = absl::GetFlag(FLAGS_long_prefill_token_threshold);
  c.scheduler.max_num_partial_prefills = absl::GetFlag(FLAGS_max_num_partial_prefills);
  c.scheduler.max_long_partial_prefills = absl::GetFlag(FLAGS_max_long_partial_prefills);
  return c;
}

}  // namespace kvserve::worker
