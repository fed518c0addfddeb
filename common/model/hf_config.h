// Reads a Hugging Face `config.json` for the decoder-only families kvserve runs: `llama`,
// `mistral`, `qwen2` and `qwen3`. Accepts both the transformers 5 layout (`rope_parameters`)
// and the older one (top-level `rope_theta` + `rope_scaling`, `torch_dtype`), which describe the
// same model and parse to the same ModelConfig.
//
//   ASSIGN_OR_RETURN(ModelConfig config, LoadHfConfig("/models/llama/config.json"));
//   int kv_heads = config.num_kv_heads;
//
// Unknown architectures, unsupported rope types and inconsistent shapes are InvalidArgument
// naming the file and the field. Pure functions; safe from any thread.
#ifndef KVSERVE_COMMON_MODEL_HF_CONFIG_H_
#define KVSERVE_COMMON_MODEL_HF_CONFIG_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace kvserve {

struct RopeConfig {
  // "default", "linear" (positions divided by factor) or "llama3" (frequency-dependent scaling).
  std::string type = "default";
  double theta = 10000.0;
  double factor = 1.0;
  double low_freq_factor = 1.0;                     // llama3
  double high_freq_factor = 4.0;                    // llama3
  int64_t original_max_position_embeddings = 8192;  // llama3

  friend bool operator==(const RopeConfig&, const RopeConfig&) = default;
};

struct ModelConfig {
  std::string model_type;    // "llama", "mistral", "qwen2", "qwen3"
  std::string architecture;  // e.g. "LlamaForCausalLM"; "" if the file names none
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;  // given, or hidden_size / num_heads
  double rms_norm_eps = 1e-6;
  int64_t max_position_embeddings = 0;
  bool qkv_bias = false;  // q/k/v projections have a bias (qwen2 always; llama/qwen3 per config)
  bool o_bias = false;    // output projection has a bias (llama/qwen3 `attention_bias`)
  bool mlp_bias = false;  // gate/up/down have a bias (llama `mlp_bias`)
  bool qk_norm = false;   // per-head RMSNorm on q and k before RoPE (qwen3)
  bool tie_word_embeddings = false;
  int sliding_window = 0;  // 0: full attention everywhere
  std::string dtype;       // checkpoint dtype as declared ("float32", "bfloat16", ...), may be ""
  int bos_token_id = -1;
  std::vector<int> eos_token_ids;
  RopeConfig rope;

  friend bool operator==(const ModelConfig&, const ModelConfig&) = default;
};

// Parses config.json text; `source` names the file in error messages.
absl::StatusOr<ModelConfig> ParseHfConfig(std::string_view json_text, std::string_view source);

// Reads `path`, or `path`/config.json when `path` is a directory.
absl::StatusOr<ModelConfig> LoadHfConfig(const std::string& path);

}  // namespace kvserve

#endif  // KVSERVE_COMMON_MODEL_HF_CONFIG_H_
