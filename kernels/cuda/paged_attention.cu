#include <algorithm>
#include <cfloat>

#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/paged_attention.h"

namespace kvserve::kernels::cuda {
namespace {

using namespace attention;  // NOLINT: the kernels' shared pieces

// One pass over the context: each group of LANES threads takes one token at a time (K and V
// rows loaded together, kUnroll tokens in flight) and keeps its own online softmax per row;
// the groups are merged at the end. No barrier inside the loop. HD is head_dim.
template <KvDType DT, int ROWS, int HD>
__global__ void __launch_bounds__(kThreads, ROWS == 4 ? (Raw<DT>::kWords >= 4 ? 4 : 3) : 2)
    PagedAttentionKernel(AttnArgs a, AttnPlan plan, float* tmp_out, float* tmp_ms) {
  extern __shared__ float red[];  // [kWarps][ROWS][head_dim]
  __shared__ float red_m[kWarps][ROWS], red_l[kWarps][ROWS];
  using R = Raw<DT>;
  constexpr int kUnroll = R::kUnroll;

  const int seq = blockIdx.z;
  const int kvh = blockIdx.y / plan.num_splits, split = blockIdx.y % plan.num_splits;
  const int group = a.num_heads / a.num_kv_heads;
  const int qlen = a.query_len[seq], ctx = a.context_len[seq], q0 = a.query_start[seq];
  const int r0 = blockIdx.x * ROWS;
  if (r0 >= qlen * group) return;
  const int nrows = min(ROWS, qlen * group - r0);
  constexpr int d = HD, lanes = HD / kVec, slots = kThreads / lanes;
  const int slot = threadIdx.x / lanes, li = threadIdx.x % lanes, c0 = li * kVec;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  float q[ROWS][kVec];
  int visible[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    visible[r] = 0;
#pragma unroll
    for (int i = 0; i < kVec; ++i) q[r][i] = 0.0f;
    if (r < nrows) {
      const int j = (r0 + r) / group, head = kvh * group + (r0 + r) % group;
      const float* qr = a.q + static_cast<int64_t>(q0 + j) * a.q_stride + head * d + c0;
#pragma unroll
      for (int i = 0; i < kVec; ++i) q[r][i] = qr[i] * a.scale;
      visible[r] = ctx - qlen + j + 1;
    }
  }
  const int last_visible = ctx - qlen + (r0 + nrows - 1) / group + 1;
  const int t_begin = split * plan.chunks_per_split * kChunkTokens;
  const int t_end = min(last_visible, t_begin + plan.chunks_per_split * kChunkTokens);
  const int32_t* table = a.block_tables + seq * a.max_blocks_per_seq;
  // block_size divides kChunkTokens, so it is a power of two: shifts, not divisions.
  const int bs = a.block_size, bs_shift = __ffs(bs) - 1, bs_mask = bs - 1;

  float m[ROWS], l[ROWS], acc[ROWS][kVec];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
#pragma unroll
    for (int i = 0; i < kVec; ++i) acc[r][i] = 0.0f;
  }
  // Block ids of the next step's tokens, loaded one step ahead.
  int blk[kUnroll];
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int t = t_begin + u * slots + slot;
    blk[u] = t < t_end ? __ldg(table + (t >> bs_shift)) : 0;
  }
  // The loop bound is the same for every thread: shuffles below see whole warps.
  for (int base = t_begin; base < t_end; base += kUnroll * slots) {
    R kr[kUnroll], vr[kUnroll];
    uint32_t kp[kUnroll], vp[kUnroll];  // per-token / per-group parameters
    int64_t bh[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int t = base + u * slots + slot;
      bh[u] = static_cast<int64_t>(blk[u]) * a.num_kv_heads + kvh;
      if (t < t_end) {
        const int64_t row = (bh[u] << bs_shift) + (t & bs_mask);
        LoadRaw<DT>(a.k + row * a.k_layout.row_bytes, c0, kr[u]);
        LoadRaw<DT>(a.v + row * a.v_layout.row_bytes, c0, vr[u]);
        kp[u] = LoadTokenParams<DT>(a.k_layout, a.k_scales, bh[u], t & bs_mask, d, c0);
        vp[u] = LoadTokenParams<DT>(a.v_layout, a.v_scales, bh[u], t & bs_mask, d, c0);
      } else {
#pragma unroll
        for (int w = 0; w < R::kWords; ++w) kr[u].w[w] = vr[u].w[w] = 0;
        kp[u] = vp[u] = 0;
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int t = base + kUnroll * slots + u * slots + slot;
      blk[u] = t < t_end ? __ldg(table + (t >> bs_shift)) : 0;
    }
    // Partial dot products of this thread's 8 channels, then one transposed sum over the
    // token group and a gather, so every thread has every (token, row) score.
    constexpr int kN = kUnroll * ROWS;
    float part[kN];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int t = base + u * slots + slot;
      float x[kVec];
      Unpack<DT>(kr[u], x);
      if (t < t_end) Scale<DT>(a.k_layout, a.k_scales, bh[u], c0, kp[u], x);
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        float dot = 0.0f;
#pragma unroll
        for (int i = 0; i < kVec; ++i) dot += q[r][i] * x[i];
        part[u * ROWS + r] = dot;
      }
    }
    TransposedSum<lanes / 2, kN, kN>(part, li);
    constexpr int kKept = kN / lanes > 1 ? kN / lanes : 1;
    constexpr int kSteps = Log2(kN / kKept) < Log2(lanes) ? Log2(kN / kKept) : Log2(lanes);
    const int group_base = lane & ~(lanes - 1);
    float score[kUnroll][ROWS];
#pragma unroll
    for (int idx = 0; idx < kN; ++idx) {
      const int code = idx / kKept, k = idx % kKept;
      const float dot =
          __shfl_sync(0xffffffffu, part[k], group_base + OwnerLane<lanes, kSteps>(code));
      const int u = idx / ROWS, r = idx % ROWS;
      const int t = base + u * slots + slot;
      score[u][r] = t < visible[r] ? dot : -INFINITY;  // t >= t_end is never visible
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      float mx = score[0][r];
#pragma unroll
      for (int u = 1; u < kUnroll; ++u) mx = fmaxf(mx, score[u][r]);
      const float m_new = fmaxf(m[r], mx);
      if (m_new == -INFINITY) continue;          // nothing visible yet for this row
      const float alpha = __expf(m[r] - m_new);  // 0 when m[r] is -inf
      l[r] *= alpha;
#pragma unroll
      for (int i = 0; i < kVec; ++i) acc[r][i] *= alpha;
      m[r] = m_new;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        score[u][r] = __expf(score[u][r] - m_new);  // 0 for masked tokens
        l[r] += score[u][r];
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int t = base + u * slots + slot;
      float x[kVec];
      Unpack<DT>(vr[u], x);
      if (t < t_end) Scale<DT>(a.v_layout, a.v_scales, bh[u], c0, vp[u], x);
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        if (m[r] == -INFINITY) continue;
        const float p = score[u][r];
#pragma unroll
        for (int i = 0; i < kVec; ++i) acc[r][i] += p * x[i];
      }
    }
  }

  // Merge the token groups: first inside each warp, then the warps through shared memory.
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
#pragma unroll
    for (int o = lanes; o < 32; o <<= 1) {
      const float m2 = __shfl_xor_sync(0xffffffffu, m[r], o);
      const float l2 = __shfl_xor_sync(0xffffffffu, l[r], o);
      float acc2[kVec];
#pragma unroll
      for (int i = 0; i < kVec; ++i) acc2[i] = __shfl_xor_sync(0xffffffffu, acc[r][i], o);
      Merge<ROWS>(m[r], l[r], acc[r], m2, l2, acc2);
    }
  }
  if (lane < lanes) {
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
#pragma unroll
      for (int i = 0; i < kVec; ++i) red[(warp * ROWS + r) * d + c0 + i] = acc[r][i];
      if (li == 0) {
        red_m[warp][r] = m[r];
        red_l[warp][r] = l[r];
      }
    }
  }
  __syncthreads();
  CombineWarps<ROWS, HD>(a, plan, red, red_m, red_l, nrows, r0, tmp_out, tmp_ms);
}

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
  PagedAttentionKernel<DT, ROWS, HD><<<grid, kThreads, smem, stream>>>(a, plan, tmp_out, tmp_ms);
  KVSERVE_CUDA_CHECK_LAUNCH();
}

template <KvDType DT, int ROWS>
void LaunchHeadDim(const AttnArgs& a, const AttnPlan& plan, float* tmp_out, float* tmp_ms,
                   cudaStream_t stream) {
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
  if (a.head_dim != 64 && a.head_dim != 128 && a.head_dim != 256) {
    return "head_dim must be 64, 128 or 256";
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

AttnPlan PlanPagedAttention(const AttnArgs& a, int num_sms, size_t max_workspace_floats,
                            int min_blocks_per_sm, bool tensor_cores) {
  AttnPlan plan;
  const int group = a.num_heads / a.num_kv_heads;
  plan.tensor_cores = tensor_cores && TensorCoreAttentionCovers(a);
  if (plan.tensor_cores) {  // 16 rows per warp; 64 per block once a sequence has more than 16
    plan.rows_per_block = a.max_query_len * group > 16 ? 64 : 16;
  } else {
    plan.rows_per_block = a.max_query_len == 1 && group <= 4 ? 4 : 8;
  }
  plan.row_tiles = (a.max_query_len * group + plan.rows_per_block - 1) / plan.rows_per_block;
  const int chunks = (a.max_context_len + kChunkTokens - 1) / kChunkTokens;
  const int64_t base = int64_t{plan.row_tiles} * a.num_kv_heads * a.num_seqs;
  const int64_t target =
      int64_t{std::max(num_sms, 1)} * (min_blocks_per_sm > 0 ? min_blocks_per_sm : 8);
  int splits = static_cast<int>(std::clamp<int64_t>((target + base - 1) / base, 1, chunks));
  const int64_t rows = int64_t{a.num_seqs} * a.max_query_len * a.num_heads;
  const int64_t per_split = rows * (a.head_dim + 2);
  if (splits > 1 && static_cast<size_t>(per_split * splits) > max_workspace_floats) {
    splits = static_cast<int>(std::max<int64_t>(1, max_workspace_floats / per_split));
  }
  splits = std::min(splits, 65535 / a.num_kv_heads);
  plan.chunks_per_split = (chunks + splits - 1) / splits;
  plan.num_splits = (chunks + plan.chunks_per_split - 1) / plan.chunks_per_split;
  plan.workspace_floats =
      plan.num_splits > 1 ? static_cast<size_t>(per_split * plan.num_splits) : 0;
  return plan;
}

void LaunchPagedAttention(const AttnArgs& a, const AttnPlan& plan, float* workspace,
                          cudaStream_t stream) {
  const char* problem = CheckAttentionShape(a);
  CHECK(problem[0] == '\0') << "paged attention: " << problem;
  if (a.num_seqs == 0) return;
  float* tmp_out = workspace;
  float* tmp_ms = plan.num_splits > 1 ? workspace + int64_t{a.num_seqs} * a.max_query_len *
                                                        a.num_heads * plan.num_splits * a.head_dim
                                      : nullptr;
  if (plan.tensor_cores) {
    LaunchTensorCoreAttention(a, plan, tmp_out, tmp_ms, stream);
  } else {
    LaunchSimt(a, plan, tmp_out, tmp_ms, stream);
  }
  if (plan.num_splits > 1) {
    const dim3 grid(a.num_heads, a.max_query_len, a.num_seqs);
    CombineSplitsKernel<<<grid, kThreads, 0, stream>>>(a, plan.num_splits, tmp_out, tmp_ms);
    KVSERVE_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace kvserve::kernels::cuda
