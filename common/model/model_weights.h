// The tensors a Hugging Face checkpoint of a supported family must hold, with their shapes,
// derived from its ModelConfig. The model loader and the tests check checkpoints against it
// so a wrong or truncated file fails at load with the tensor's name, not later as garbage.
//
//   for (const WeightSpec& w : ExpectedWeights(config)) { ... ckpt->Find(w.name) ... }
#ifndef KVSERVE_COMMON_MODEL_MODEL_WEIGHTS_H_
#define KVSERVE_COMMON_MODEL_MODEL_WEIGHTS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/model/hf_config.h"
#include "common/model/safetensors.h"

namespace kvserve {

struct WeightSpec {
  std::string name;
  std::vector<int64_t> shape;
};

// Every tensor, in a stable order (embedding, layers in order, final norm, LM head).
std::vector<WeightSpec> ExpectedWeights(const ModelConfig& config);

// The parameters of all of ExpectedWeights' tensors.
int64_t NumParams(const ModelConfig& config);

// InvalidArgument naming the first tensor that is missing, has the wrong shape, or has a
// dtype other than F32/F16/BF16.
absl::Status CheckWeights(const ModelConfig& config, const Checkpoint& checkpoint);

}  // namespace kvserve

#endif  // KVSERVE_COMMON_MODEL_MODEL_WEIGHTS_H_
