// KV-cache capacity planning: from a model's shape, the KV format, the GPU's memory and the
// tensor-parallel size, how many bytes a token, a request and a batch of requests cost, how
// many blocks fit beside the weights, and how many requests of a given length run at once.
// kvserve-plan prints it; the arithmetic is KvCacheSpec's, the same the engine allocates by.
//
//   PlanInput in{.num_layers = 32, .num_kv_heads = 8, .head_dim = 128, .num_seqs = 4, .seq_len =
//   8192}; ASSIGN_OR_RETURN(PlanResult r, PlanKvCache(in));   // r.kv_cache_bytes == 4 GiB
#ifndef KVSERVE_COMMON_KV_KV_PLANNER_H_
#define KVSERVE_COMMON_KV_KV_PLANNER_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/kv/kv_format.h"

namespace kvserve {

struct PlanInput {
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int64_t num_params = 0;             // weights; 0 when unknown
  double weight_bytes_per_param = 2;  // bf16 / fp16
  KvQuantOptions quant;               // dtype "auto" means fp16 here (a GPU's model dtype)
  int block_size = 16;
  int tensor_parallel_size = 1;
  int64_t num_seqs = 1;
  int64_t seq_len = 2048;  // tokens of context per sequence
  double gpu_memory_gib = 80;
  double gpu_memory_utilization = 0.9;
  double activation_reserve_gib = 1.0;
  double cuda_context_gib = 0.5;
};

struct PlanResult {
  std::string kv_format;  // e.g. "int8/per_group:128"
  int kv_heads_per_rank = 0;
  bool kv_heads_replicated = false;  // kv_heads < tp: every rank holds whole heads
  double kv_bytes_per_token = 0;     // whole model, every rank together
  double kv_bytes_per_token_per_rank = 0;
  int64_t kv_block_bytes_per_rank = 0;
  int64_t kv_bytes_per_request = 0;  // one sequence of seq_len tokens (whole blocks)
  int64_t kv_bytes_per_layer_per_request = 0;
  int64_t kv_cache_bytes = 0;  // num_seqs × seq_len, whole blocks, every rank together
  int64_t weight_bytes_per_rank = 0;
  int64_t kv_budget_bytes_per_rank = 0;  // GPU memory left for the KV pool
  int64_t blocks_per_rank = 0;
  int64_t max_concurrency = 0;  // sequences of seq_len tokens that fit at once
  bool fits = false;            // num_seqs × seq_len fits
};

// InvalidArgument naming the flag for non-positive sizes, a TP size that neither divides nor
// exceeds-and-is-a-multiple-of the KV heads, or a bad KV format.
absl::StatusOr<PlanResult> PlanKvCache(const PlanInput& input);

}  // namespace kvserve

#endif  // KVSERVE_COMMON_KV_KV_PLANNER_H_
