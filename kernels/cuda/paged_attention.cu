#include <algorithm>
#include <cfloat>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/kv_codec.cuh"
#include "kernels/cuda/paged_attention.h"

namespace kvserve::kernels::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kVec = 8;  // elements a thread reads per token row

// Eight elements of one token row in storage form: the words a thread loads at once.
template <KvDType DT>
struct Raw {
  static constexpr int kWords = DT == KvDType::kFp32                             ? 8
                                : (DT == KvDType::kFp16 || DT == KvDType::kBf16) ? 4
                                : DT == KvDType::kInt4                           ? 1
                                                                                 : 2;
  // Tokens a thread keeps in flight (K and V rows each): 128 bytes for fp32 / fp16 / bf16,
  // 64 for int8 / fp8, 32 for int4, as far as registers allow.
  static constexpr int kUnroll = kWords == 8 ? 2 : 4;
  uint32_t w[kWords];
};

template <KvDType DT>
__device__ __forceinline__ void LoadRaw(const uint8_t* row, int c0, Raw<DT>& r) {
  constexpr int kBytes = Raw<DT>::kWords * 4;
  const uint8_t* p = row + static_cast<int64_t>(c0) * kBytes / kVec;
  if constexpr (kBytes == 32) {
    const uint4 a = __ldg(reinterpret_cast<const uint4*>(p));
    const uint4 b = __ldg(reinterpret_cast<const uint4*>(p) + 1);
    r.w[0] = a.x, r.w[1] = a.y, r.w[2] = a.z, r.w[3] = a.w;
    r.w[4] = b.x, r.w[5] = b.y, r.w[6] = b.z, r.w[7] = b.w;
  } else if constexpr (kBytes == 16) {
    const uint4 a = __ldg(reinterpret_cast<const uint4*>(p));
    r.w[0] = a.x, r.w[1] = a.y, r.w[2] = a.z, r.w[3] = a.w;
  } else if constexpr (kBytes == 8) {
    const uint2 a = __ldg(reinterpret_cast<const uint2*>(p));
    r.w[0] = a.x, r.w[1] = a.y;
  } else {
    r.w[0] = __ldg(reinterpret_cast<const uint32_t*>(p));
  }
}

// Storage words to floats, before scales.
template <KvDType DT>
__device__ __forceinline__ void Unpack(const Raw<DT>& r, float (&x)[kVec]) {
  if constexpr (DT == KvDType::kFp32) {
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] = __uint_as_float(r.w[i]);
  } else if constexpr (DT == KvDType::kFp16) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&r.w[i]));
      x[2 * i] = f.x, x[2 * i + 1] = f.y;
    }
  } else if constexpr (DT == KvDType::kBf16) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      // bf16 → float is a shift: the low half is element 2i, the high half 2i + 1.
      x[2 * i] = __uint_as_float(r.w[i] << 16);
      x[2 * i + 1] = __uint_as_float(r.w[i] & 0xffff0000u);
    }
  } else if constexpr (DT == KvDType::kInt8) {
    // Integer → float without the quarter-rate I2F: each code, offset by 128 to make it
    // unsigned, is permuted into the low byte of 2^23's bit pattern (0x4b0000xx), and
    // 2^23 + 128 is subtracted: one PRMT and one FADD per element.
#pragma unroll
    for (int w = 0; w < 2; ++w) {
      const uint32_t biased = r.w[w] ^ 0x80808080u;
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        x[4 * w + b] = __uint_as_float(__byte_perm(biased, 0x4b000000u, 0x7440u + b)) - 8388736.0f;
      }
    }
  } else if constexpr (DT == KvDType::kFp8E4M3) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(
          static_cast<__nv_fp8x2_storage_t>(r.w[i / 2] >> (16 * (i % 2))), __NV_E4M3);
      const float2 f = __half22float2(__half2(h));
      x[2 * i] = f.x, x[2 * i + 1] = f.y;
    }
  } else {  // int4: element i in bits 4i..4i+3 of the little-endian word
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      x[i] = __uint_as_float(((r.w[0] >> (4 * i)) & 0xfu) | 0x4b000000u) - 8388608.0f;
    }
  }
}

__host__ __device__ constexpr bool IsQuantized(KvDType t) {
  return t == KvDType::kFp8E4M3 || t == KvDType::kInt8 || t == KvDType::kInt4;
}

// The fp16 parameters (scale, and the minimum for int4) of the token at `off` of block-head
// `bh` for channels c0..c0+7, as raw bits (scale low, minimum high), loaded in the same step
// as the token's codes so their latency overlaps. Per-channel parameters are read in Scale.
template <KvDType DT>
__device__ __forceinline__ uint32_t LoadTokenParams(const DevKvLayout& l, const uint16_t* scales,
                                                    int64_t bh, int off, int head_dim, int c0) {
  if constexpr (!IsQuantized(DT)) {
    return 0;
  } else {
    if (l.granularity == KvGranularity::kPerChannel) return 0;
    int index = off * l.params;
    if (l.granularity == KvGranularity::kPerGroup) {
      index = ((off * head_dim + c0) >> l.group_shift) * l.params;  // (off·groups + group)
    }
    const uint16_t* p = scales + bh * l.scale_entries + index;
    if constexpr (DT == KvDType::kInt4) {
      return __ldg(reinterpret_cast<const uint32_t*>(p));  // index is even: 4-byte aligned
    } else {
      return __ldg(p);
    }
  }
}

// Applies the scales to elements c0..c0+7 of the token at `off` of block-head `bh`: from
// `params` (LoadTokenParams) per token or group, from memory per channel.
template <KvDType DT>
__device__ __forceinline__ void Scale(const DevKvLayout& l, const uint16_t* scales, int64_t bh,
                                      int c0, uint32_t params, float (&x)[kVec]) {
  if constexpr (!IsQuantized(DT)) {
    return;
  } else {
    if (l.granularity == KvGranularity::kPerChannel) {
      const uint16_t* s = scales + bh * l.scale_entries;
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        const DevQParams p = DevLoadParams(s + (c0 + i) * l.params, DT);
        x[i] = x[i] * p.scale + p.zero;
      }
      return;
    }
    const float scale = DevF16Value(static_cast<uint16_t>(params & 0xffffu));
    const float zero =
        DT == KvDType::kInt4 ? DevF16Value(static_cast<uint16_t>(params >> 16)) : 0.0f;
#pragma unroll
    for (int i = 0; i < kVec; ++i) x[i] = x[i] * scale + zero;
  }
}

// Folds (m2, l2, acc2) into (m, l, acc): two online-softmax states of the same rows.
template <int ROWS>
__device__ __forceinline__ void Merge(float& m, float& l, float (&acc)[kVec], float m2, float l2,
                                      const float (&acc2)[kVec]) {
  const float m_new = fmaxf(m, m2);
  const float a = m == -INFINITY ? 0.0f : __expf(m - m_new);
  const float b = m2 == -INFINITY ? 0.0f : __expf(m2 - m_new);
  l = l * a + l2 * b;
#pragma unroll
  for (int i = 0; i < kVec; ++i) acc[i] = acc[i] * a + acc2[i] * b;
  m = m_new;
}

// Sums each of v[0..N) over the LANES threads of a token group, transposed: at each halving
// step a thread keeps half of its values and trades the other half with its partner, so the
// N sums cost N − 1 shuffles instead of N·log2(LANES). Afterwards thread `li` holds in
// v[0..max(1, N / LANES)) the sums of the indices (code << log2(N / LANES)) + k, with `code`
// made of li's bits O = LANES/2, LANES/4, ... (high to low) for as many steps as N allows.
template <int O, int n, int N>
__device__ __forceinline__ void TransposedSum(float (&v)[N], int li) {
  if constexpr (O >= 1) {
    if constexpr (n > 1) {
      const bool upper = (li & O) != 0;
#pragma unroll
      for (int k = 0; k < n / 2; ++k) {
        const float send = upper ? v[k] : v[k + n / 2];
        const float keep = upper ? v[k + n / 2] : v[k];
        v[k] = keep + __shfl_xor_sync(0xffffffffu, send, O);
      }
      TransposedSum<O / 2, n / 2, N>(v, li);
    } else {
      v[0] += __shfl_xor_sync(0xffffffffu, v[0], O);
      TransposedSum<O / 2, 1, N>(v, li);
    }
  }
}

// The lane (within its group) that holds the sum of index `code` after TransposedSum: the code's
// bits placed at offsets LANES/2, LANES/4, ... (as many as there were transposed steps).
template <int LANES, int STEPS>
__device__ __forceinline__ int OwnerLane(int code) {
  int lane = 0;
#pragma unroll
  for (int i = 0; i < STEPS; ++i) {
    if (code & (1 << (STEPS - 1 - i))) lane |= LANES >> (i + 1);
  }
  return lane;
}

__host__ __device__ constexpr int Log2(int x) { return x <= 1 ? 0 : 1 + Log2(x / 2); }

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
  for (int e = threadIdx.x; e < nrows * d; e += kThreads) {
    const int r = e / d, c = e % d;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, red_m[w][r]);
    float v = 0.0f, sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      if (red_m[w][r] == -INFINITY) continue;
      const float f = __expf(red_m[w][r] - mx);
      v += f * red[(w * ROWS + r) * d + c];
      sum += f * red_l[w][r];
    }
    const int j = (r0 + r) / group, head = kvh * group + (r0 + r) % group;
    if (plan.num_splits == 1) {
      a.out[(static_cast<int64_t>(q0 + j) * a.num_heads + head) * d + c] = v / sum;
    } else {
      const int64_t idx = ((static_cast<int64_t>(seq) * a.max_query_len + j) * a.num_heads + head) *
                              plan.num_splits +
                          split;
      tmp_out[idx * d + c] = sum > 0.0f ? v / sum : 0.0f;
      if (c == 0) {
        tmp_ms[2 * idx] = mx;
        tmp_ms[2 * idx + 1] = sum;
      }
    }
  }
}

// grid (num_heads, max_query_len, num_seqs): merges a row's splits by their softmax weights.
__global__ void CombineSplitsKernel(AttnArgs a, int num_splits, const float* tmp_out,
                                    const float* tmp_ms) {
  const int head = blockIdx.x, j = blockIdx.y, seq = blockIdx.z;
  if (j >= a.query_len[seq]) return;
  const int64_t base =
      ((static_cast<int64_t>(seq) * a.max_query_len + j) * a.num_heads + head) * num_splits;
  float m = -INFINITY;
  for (int s = 0; s < num_splits; ++s) m = fmaxf(m, tmp_ms[2 * (base + s)]);
  float total = 0.0f;
  for (int s = 0; s < num_splits; ++s) {
    const float sum = tmp_ms[2 * (base + s) + 1];
    if (sum > 0.0f) total += __expf(tmp_ms[2 * (base + s)] - m) * sum;
  }
  const int d = a.head_dim;
  float* out = a.out + (static_cast<int64_t>(a.query_start[seq] + j) * a.num_heads + head) * d;
  for (int c = threadIdx.x; c < d; c += blockDim.x) {
    float v = 0.0f;
    for (int s = 0; s < num_splits; ++s) {
      const float sum = tmp_ms[2 * (base + s) + 1];
      if (sum > 0.0f) v += __expf(tmp_ms[2 * (base + s)] - m) * sum * tmp_out[(base + s) * d + c];
    }
    out[c] = v / total;
  }
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
                            int min_blocks_per_sm) {
  AttnPlan plan;
  const int group = a.num_heads / a.num_kv_heads;
  plan.rows_per_block = a.max_query_len == 1 && group <= 4 ? 4 : 8;
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
  if (plan.num_splits > 1) {
    const dim3 grid(a.num_heads, a.max_query_len, a.num_seqs);
    CombineSplitsKernel<<<grid, kThreads, 0, stream>>>(a, plan.num_splits, tmp_out, tmp_ms);
    KVSERVE_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace kvserve::kernels::cuda
