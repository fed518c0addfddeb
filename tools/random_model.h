// A Llama-architecture checkpoint with random weights in Hugging Face layout (config.json,
// generation_config.json, model.safetensors in bf16): the plumbing model of kvserve-make-model
// and of tests that need a model of a given shape (e.g. head_dim 128) without downloading one.
#ifndef KVSERVE_TOOLS_RANDOM_MODEL_H_
#define KVSERVE_TOOLS_RANDOM_MODEL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace kvserve {

struct RandomModelOptions {
  int vocab = 0;
  int hidden = 64, layers = 2, heads = 4, kv_heads = 2, intermediate = 192;
  int max_position_embeddings = 8192;
  uint64_t seed = 0;
  int bos_id = 0;
  std::vector<int> eos_ids;
};

// Writes the checkpoint into `out` (created); InvalidArgument for impossible sizes.
absl::Status WriteRandomLlama(const RandomModelOptions& o, const std::string& out);

}  // namespace kvserve

#endif  // KVSERVE_TOOLS_RANDOM_MODEL_H_
