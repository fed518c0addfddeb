#include "common/kv/kv_planner.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace kvserve {

absl::StatusOr<PlanResult> PlanKvCache(const PlanInput& in) {
  auto positive = [](int64_t v, const char* flag) -> absl::Status {
    if (v > 0) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(flag, " must be positive, got ", v));
  };
  RETURN_IF_ERROR(positive(in.num_layers, "--num-layers"));
  RETURN_IF_ERROR(positive(in.num_kv_heads, "--num-kv-heads"));
  RETURN_IF_ERROR(positive(in.head_dim, "--head-dim"));
  RETURN_IF_ERROR(positive(in.block_size, "--block-size"));
  RETURN_IF_ERROR(positive(in.tensor_parallel_size, "--tensor-parallel-size"));
  RETURN_IF_ERROR(positive(in.num_seqs, "--num-seqs"));
  RETURN_IF_ERROR(positive(in.seq_len, "--seq-len"));
  if (!(in.gpu_memory_utilization > 0 && in.gpu_memory_utilization <= 1)) {
    return absl::InvalidArgumentError("--gpu-memory-utilization must be in (0, 1]");
  }
  const int tp = in.tensor_parallel_size;
  PlanResult r;
  if (in.num_kv_heads >= tp) {
    if (in.num_kv_heads % tp != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--tensor-parallel-size ", tp, " does not divide the KV heads (", in.num_kv_heads, ")"));
    }
    r.kv_heads_per_rank = in.num_kv_heads / tp;
  } else {
    if (tp % in.num_kv_heads != 0) {
      return absl::InvalidArgumentError(absl::StrCat("--tensor-parallel-size ", tp,
                                                     " is not a multiple of the KV heads (",
                                                     in.num_kv_heads, ")"));
    }
    r.kv_heads_per_rank = 1;  // each KV head replicated on tp / kv_heads ranks
    r.kv_heads_replicated = true;
  }
  KvQuantOptions quant = in.quant;
  ASSIGN_OR_RETURN(KvCacheSpec spec,
                   MakeKvCacheSpec(quant, in.num_layers, in.head_dim, KvDType::kFp16));
  r.kv_format = spec.k[in.num_layers / 2].Describe();
  if (!(spec.k[in.num_layers / 2] == spec.v[in.num_layers / 2])) {
    r.kv_format = absl::StrCat("k:", r.kv_format, ",v:", spec.v[in.num_layers / 2].Describe());
  }
  const int64_t block_all = spec.BytesPerBlock(in.num_kv_heads, in.block_size, in.head_dim);
  r.kv_block_bytes_per_rank = spec.BytesPerBlock(r.kv_heads_per_rank, in.block_size, in.head_dim);
  r.kv_bytes_per_token = static_cast<double>(block_all) / in.block_size;
  r.kv_bytes_per_token_per_rank = static_cast<double>(r.kv_block_bytes_per_rank) / in.block_size;
  const int64_t blocks_per_seq = (in.seq_len + in.block_size - 1) / in.block_size;
  r.kv_bytes_per_request = blocks_per_seq * block_all;
  r.kv_bytes_per_layer_per_request = r.kv_bytes_per_request / in.num_layers;
  r.kv_cache_bytes = r.kv_bytes_per_request * in.num_seqs;
  r.weight_bytes_per_rank = static_cast<int64_t>(
      std::ceil(static_cast<double>(in.num_params) * in.weight_bytes_per_param / tp));
  const double gib = 1073741824.0;
  r.kv_budget_bytes_per_rank = static_cast<int64_t>(
      in.gpu_memory_gib * in.gpu_memory_utilization * gib - r.weight_bytes_per_rank -
      (in.activation_reserve_gib + in.cuda_context_gib) * gib);
  r.blocks_per_rank = std::max<int64_t>(0, r.kv_budget_bytes_per_rank / r.kv_block_bytes_per_rank);
  r.max_concurrency = r.blocks_per_rank / blocks_per_seq;
  r.fits = r.max_concurrency >= in.num_seqs;
  return r;
}

}  // namespace kvserve
