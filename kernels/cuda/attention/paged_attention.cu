#include <algorithm>
#include <cfloat>

#include "kernels/cuda/attention/attention_common.cuh"
#include "kernels/cuda/attention/paged_attention.h"
#include "kernels/cuda/attention/paged_attention_simt.cuh"
#include "kernels/cuda/device/cuda_check.h"
#include "kernels/cuda/device/launch.cuh"

namespace kvserve::kernels::cuda {
namespace {

using namespace attention;  // NOLINT: the kernels' shared pieces

__global__ void CombineSplitsKernel(AttnArgs a, int num_splits, const float* tmp_out,
                                    const float* tmp_ms) {
  CombineSplits(a, num_splits, tmp_out, tmp_ms);
}

template <KvDType DT, int ROWS, int HD>
void Launch(const AttnArgs& a, const AttnPlan& plan, float* tmp_out, float* tmp_ms,
            cudaStream_t stream) {
  const size_t smem = sizeof(float) * kWarps * ROWS * a.head_dim;
  // At most 32 KiB (ROWS 8, head_dim 256): within the default limit, no opt-in needed.
  const dim3 grid(plan.row_tiles, a.num_kv_heads * plan.num_splits, a.num_seqs);
  LaunchKernel(PagedAttentionKernel<DT, ROWS, HD>, grid, kThreads, smem, stream, a, plan, tmp_out,
               tmp_ms);
}

// head_dim 16 and 32 (small models, the test fixtures) only with 8 rows per block: the plan
// never asks for 4 there, which keeps the instantiations down.
template <KvDType DT, int ROWS>
void LaunchHeadDim(const AttnArgs& a, const AttnPlan& plan, float* tmp_out, float* tmp_ms,
                   cudaStream_t stream) {
  if constexpr (ROWS == 8) {
    if (a.head_dim == 16) return Launch<DT, ROWS, 16>(a, plan, tmp_out, tmp_ms, stream);
    if (a.head_dim == 32) return Launch<DT, ROWS, 32>(a, plan, tmp_out, tmp_ms, stream);
  }
  CHECK_GE(a.head_dim, 64) << "paged attention: 4 rows per block at head_dim " << a.head_dim;
  switch (a.head_dim) {
    case 64:
      Launch<DT, ROWS, 64>(a, plan, tmp_out, tmp_ms, stream);
      break;
    case 128:
      Launch<DT, ROWS, 128>(a, plan, tmp_out, tmp_ms, stream);
      break;
    default:
      Launch<DT, ROWS, 256>(a, plan, tmp_out, tmp_ms, stream);
      break;
  }
}

template <KvDType DT>
void LaunchRows(const AttnArgs& a, const AttnPlan& plan, float* tmp_out, float* tmp_ms,
                cudaStream_t stream) {
  if (plan.rows_per_block == 4) {
    LaunchHeadDim<DT, 4>(a, plan, tmp_out, tmp_ms, stream);
  } else {
    LaunchHeadDim<DT, 8>(a, plan, tmp_out, tmp_ms, stream);
  }
}

void LaunchSimt(const AttnArgs& a, const AttnPlan& plan, float* tmp_out, float* tmp_ms,
                cudaStream_t stream) {
  switch (a.k_layout.dtype) {
    case KvDType::kFp32:
      LaunchRows<KvDType::kFp32>(a, plan, tmp_out, tmp_ms, stream);
      break;
    case KvDType::kFp16:
      LaunchRows<KvDType::kFp16>(a, plan, tmp_out, tmp_ms, stream);
      break;
    case KvDType::kBf16:
      LaunchRows<KvDType::kBf16>(a, plan, tmp_out, tmp_ms, stream);
      break;
    case KvDType::kFp8E4M3:
      LaunchRows<KvDType::kFp8E4M3>(a, plan, tmp_out, tmp_ms, stream);
      break;
    case KvDType::kInt8:
      LaunchRows<KvDType::kInt8>(a, plan, tmp_out, tmp_ms, stream);
      break;
    case KvDType::kInt4:
      LaunchRows<KvDType::kInt4>(a, plan, tmp_out, tmp_ms, stream);
      break;
  }
}

}  // namespace

const char* CheckAttentionShape(const AttnArgs& a) {
  if (a.head_dim != 16 && a.head_dim != 32 && a.head_dim != 64 && a.head_dim != 128 &&
      a.head_dim != 256) {
    return "head_dim must be 16, 32, 64, 128 or 256";
  }
  if (a.num_kv_heads <= 0 || a.num_heads % a.num_kv_heads != 0) {
    return "num_heads must be a multiple of num_kv_heads";
  }
  if (a.block_size <= 0 || kChunkTokens % a.block_size != 0) {
    return "block_size must divide 256";
  }
  if (a.k_layout.dtype != a.v_layout.dtype) return "K and V must share an element type";
  for (const DevKvLayout* l : {&a.k_layout, &a.v_layout}) {
    if (l->granularity == KvGranularity::kPerGroup &&
        (l->group_size % kVec != 0 || l->group_size != 1 << l->group_shift)) {
      return "per-group sizes must be powers of two, at least 8";
    }
  }
  if (a.max_query_len <= 0 || a.max_context_len <= 0) {
    return "max_query_len and max_context_len must be set";
  }
  if (a.num_seqs > 65535 || a.max_query_len > 65535) {
    return "at most 65535 sequences and 65535 query tokens per sequence in one launch";
  }
  return "";
}

namespace {

constexpr int kTile = 64;             // the pipelined kernel's tile (kTileTokens)
constexpr int kMinSplitTokens = 256;  // its shortest split: the prologue is amortised

// The pipelined kernel's split-KV factor: one wave of `target` blocks over (KV head, sequence)
// pairs (fewer splits than that when the batch alone fills it), no split under kMinSplitTokens.
int PipelinedSplits(const AttnArgs& a, int64_t target) {
  const int64_t base = int64_t{a.num_kv_heads} * a.num_seqs;
  const int64_t longest = (a.max_context_len + kMinSplitTokens - 1) / kMinSplitTokens;
  return static_cast<int>(std::clamp<int64_t>(target / base, 1, longest));
}

// The plan's kernel, row tiling and split-KV factor, before the split is rounded to whole
// chunks (or tiles) per split (which may only lower it); `per_split` gets the workspace floats
// a split takes.
AttnPlan PlanSplits(const AttnArgs& a, int num_sms, size_t max_workspace_floats,
                    int min_blocks_per_sm, bool tensor_cores, bool pipelined,
                    int64_t* per_split_floats) {
  AttnPlan plan;
  const int group = a.num_heads / a.num_kv_heads;
  plan.pipelined = pipelined && PipelinedAttentionCovers(a);
  plan.tensor_cores =
      !plan.pipelined && (tensor_cores || pipelined) && TensorCoreAttentionCovers(a);
  if (plan.pipelined) {
    plan.rows_per_block = 8;
  } else if (plan.tensor_cores) {  // 16 rows per warp; 64 per block once a sequence has more
    plan.rows_per_block = a.max_query_len * group > 16 ? 64 : 16;
  } else {
    plan.rows_per_block = a.max_query_len == 1 && group <= 4 && a.head_dim >= 64 ? 4 : 8;
  }
  plan.row_tiles = (a.max_query_len * group + plan.rows_per_block - 1) / plan.rows_per_block;
  const int chunks = (a.max_context_len + kChunkTokens - 1) / kChunkTokens;
  const int64_t base = int64_t{plan.row_tiles} * a.num_kv_heads * a.num_seqs;
  int splits = 1;
  if (plan.pipelined) {
    splits = PipelinedSplits(
        a, int64_t{std::max(num_sms, 1)} * (min_blocks_per_sm > 0 ? min_blocks_per_sm : 2));
  } else {
    const int64_t target =
        int64_t{std::max(num_sms, 1)} * (min_blocks_per_sm > 0 ? min_blocks_per_sm : 8);
    splits = static_cast<int>(std::clamp<int64_t>((target + base - 1) / base, 1, chunks));
  }
  const int64_t rows = int64_t{a.num_seqs} * a.max_query_len * a.num_heads;
  const int64_t per_split = rows * (a.head_dim + 2);
  if (splits > 1 && static_cast<size_t>(per_split * splits) > max_workspace_floats) {
    splits = static_cast<int>(std::max<int64_t>(1, max_workspace_floats / per_split));
  }
  splits = std::min(splits, 65535 / a.num_kv_heads);
  plan.num_splits = splits;
  *per_split_floats = per_split;
  return plan;
}

}  // namespace

AttnPlan PlanPagedAttention(const AttnArgs& a, int num_sms, size_t max_workspace_floats,
                            int min_blocks_per_sm, bool tensor_cores, bool pipelined) {
  int64_t per_split = 0;
  AttnPlan plan = PlanSplits(a, num_sms, max_workspace_floats, min_blocks_per_sm, tensor_cores,
                             pipelined, &per_split);
  const int splits = plan.num_splits;
  if (plan.pipelined) {  // whole tiles per split
    const int tiles = (a.max_context_len + kTile - 1) / kTile;
    plan.split_tokens = (tiles + splits - 1) / splits * kTile;
    plan.num_splits = (a.max_context_len + plan.split_tokens - 1) / plan.split_tokens;
  } else {
    const int chunks = (a.max_context_len + kChunkTokens - 1) / kChunkTokens;
    plan.chunks_per_split = (chunks + splits - 1) / splits;
    plan.num_splits = (chunks + plan.chunks_per_split - 1) / plan.chunks_per_split;
    plan.split_tokens = plan.chunks_per_split * kChunkTokens;
  }
  plan.workspace_floats =
      plan.num_splits > 1 ? static_cast<size_t>(per_split * plan.num_splits) : 0;
  if (plan.pipelined && plan.num_splits > 1) {
    plan.split_counters = int64_t{a.num_seqs} * a.num_kv_heads;
  }
  return plan;
}

size_t MaxPagedAttentionWorkspaceFloats(const AttnArgs& limits, int64_t max_tokens, int num_sms,
                                        size_t max_workspace_floats, int min_blocks_per_sm,
                                        bool tensor_cores, bool pipelined) {
  size_t most = 0;
  AttnArgs a = limits;
  a.block_size = std::max(a.block_size, 2);  // no split plan depends on it; the kernels' covers do
  // Both kernels' tilings (a float32 cache, or a layer kept at full precision, runs SIMT).
  for (const KvDType dtype : {KvDType::kFp32, KvDType::kBf16}) {
    a.k_layout.dtype = a.v_layout.dtype = dtype;
    for (int seqs = 1; seqs <= limits.num_seqs; ++seqs) {
      a.num_seqs = seqs;
      // Each sequence has a token at least: the longest query leaves seqs - 1 for the others.
      for (int64_t q = 1; q <= std::min<int64_t>(max_tokens - seqs + 1, 65535); ++q) {
        a.max_query_len = static_cast<int>(q);
        int64_t per_split = 0;
        const AttnPlan plan = PlanSplits(a, num_sms, max_workspace_floats, min_blocks_per_sm,
                                         tensor_cores, pipelined, &per_split);
        if (plan.num_splits > 1) {
          most = std::max(most, static_cast<size_t>(per_split * plan.num_splits));
        } else if (q * (a.num_heads / a.num_kv_heads) > 64) {
          break;  // past the row-tiling switches, longer queries only split less
        }
      }
    }
  }
  return most;
}

void LaunchPagedAttention(const AttnArgs& a, const AttnPlan& plan, float* workspace,
                          unsigned* split_counters, cudaStream_t stream) {
  const char* problem = CheckAttentionShape(a);
  CHECK(problem[0] == '\0') << "paged attention: " << problem;
  if (a.num_seqs == 0) return;
  float* tmp_out = workspace;
  float* tmp_ms = plan.num_splits > 1 ? workspace + int64_t{a.num_seqs} * a.max_query_len *
                                                        a.num_heads * plan.num_splits * a.head_dim
                                      : nullptr;
  if (plan.pipelined) {  // merges its splits itself
    LaunchPipelinedAttention(a, plan, tmp_out, tmp_ms, split_counters, stream);
    return;
  }
  if (plan.tensor_cores) {
    LaunchTensorCoreAttention(a, plan, tmp_out, tmp_ms, stream);
  } else {
    LaunchSimt(a, plan, tmp_out, tmp_ms, stream);
  }
  if (plan.num_splits > 1) {
    const dim3 grid(a.num_heads, a.max_query_len, a.num_seqs);
    LaunchKernel(CombineSplitsKernel, grid, kCombineThreads, 0, stream, a, plan.num_splits, tmp_out,
                 tmp_ms);
  }
}

}  // namespace kvserve::kernels::cuda
