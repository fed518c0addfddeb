// A Llama-family decoder (llama, mistral, qwen2, qwen3) executed through a kernels::Backend
// over a paged KV cache. Loads Hugging Face checkpoints (F32/F16/BF16, converted to float32
// for the CPU backend), fusing q/k/v and gate/up projections into one GEMM each.
//
//   ASSIGN_OR_RETURN(auto model, Model::Load(dir, config, backend.get()));
//   std::vector<float> logits = model->Forward(batch, kv);  // [batch.logit_rows.size(), vocab]
//
// Used by the engine thread only.
#ifndef KVSERVE_WORKER_MODEL_MODEL_H_
#define KVSERVE_WORKER_MODEL_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/hf_config.h"
#include "kernels/backend.h"
#include "worker/kv_cache/kv_storage.h"

namespace kvserve::worker {

// One forward pass over a flat batch of tokens from several sequences.
struct ForwardBatch {
  std::vector<int32_t> token_ids;     // [T]
  std::vector<int32_t> positions;     // [T]
  std::vector<int64_t> slot_mapping;  // [T]: block * block_size + offset
  std::vector<int32_t> query_start;   // [S]
  std::vector<int32_t> query_len;     // [S]
  std::vector<int32_t> context_len;   // [S]: tokens in the cache after this pass
  std::vector<int32_t> block_tables;  // [S, max_blocks_per_seq]
  int max_blocks_per_seq = 0;
  std::vector<int32_t> logit_rows;    // token rows whose logits are wanted
};

class Model {
 public:
  // InvalidArgument naming the tensor when the checkpoint does not fit the config.
  static absl::StatusOr<std::unique_ptr<Model>> Load(const std::string& dir,
                                                     const ModelConfig& config,
                                                     kernels::Backend* backend);

  // Runs the batch, writing its K/V into (and reading context from) `kv`.
  std::vector<float> Forward(const ForwardBatch& batch, KvStorage& kv);

  [[nodiscard]] const ModelConfig& config() const { return config_; }
  // Bytes of the weights as loaded (float32 on the CPU backend).
  [[nodiscard]] int64_t weight_bytes() const { return weight_bytes_; }

 private:
  struct Layer {
    std::vector<float> input_norm, post_norm;
    std::vector<float> qkv, qkv_bias;  // [(q + 2 kv) × hidden], bias empty when absent
    std::vector<float> q_norm, k_norm;  // qwen3
    std::vector<float> o, o_bias;
    std::vector<float> gate_up, gate_up_bias;  // [2 inter × hidden]
    std::vector<float> down, down_bias;
  };

  Model(const ModelConfig& config, kernels::Backend* backend) : config_(config), backend_(backend) {}

  ModelConfig config_;
  kernels::Backend* backend_;
  std::vector<float> embed_, final_norm_, lm_head_;  // lm_head_ empty when tied
  std::vector<Layer> layers_;
  std::vector<float> inv_freq_;
  int64_t weight_bytes_ = 0;
};

}  // namespace kvserve::worker

#endif  // KVSERVE_WORKER_MODEL_MODEL_H_
