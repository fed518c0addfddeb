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
  // Rows a thread keeps in flight: about 64 bytes whatever the element size.
  static constexpr int kUnroll = 16 / kWords < 2 ? 2 : 16 / kWords;
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
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      x[i] = static_cast<float>(static_cast<int8_t>((r.w[i / 4] >> (8 * (i % 4))) & 0xff));
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
    for (int i = 0; i < 8; ++i) x[i] = static_cast<float>((r.w[0] >> (4 * i)) & 0xf);
  }
}

// Applies the scales of the token at `off` of block-head `bh` to elements c0..c0+7.
template <KvDType DT>
__device__ __forceinline__ void Scale(const DevKvLayout& l, const uint16_t* scales, int64_t bh,
                                      int off, int head_dim, int c0, float (&x)[kVec]) {
  if constexpr (DT == KvDType::kFp32 || DT == KvDType::kFp16 || DT == KvDType::kBf16) {
    return;
  } else {
    const uint16_t* s = scales + bh * l.scale_entries;
    if (l.granularity == KvGranularity::kPerChannel) {
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        const DevQParams p = DevLoadParams(s + (c0 + i) * l.params, DT);
        x[i] = x[i] * p.scale + p.zero;
      }
      return;
    }
    int64_t index = static_cast<int64_t>(off) * l.params;
    if (l.granularity == KvGranularity::kPerGroup) {
      const int groups = head_dim / l.group_size;
      index = (static_cast<int64_t>(off) * groups + c0 / l.group_size) * l.params;
    }
    const DevQParams p = DevLoadParams(s + index, DT);
#pragma unroll
    for (int i = 0; i < kVec; ++i) x[i] = x[i] * p.scale + p.zero;
  }
}

template <KvDType DT, int ROWS>
__global__ void __launch_bounds__(kThreads, ROWS == 4 ? 4 : 2)
    PagedAttentionKernel(AttnArgs a, AttnPlan plan, float* tmp_out, float* tmp_ms) {
  extern __shared__ float smem[];  // logits [ROWS][kChunkTokens]; then [kWarps][ROWS][head_dim]
  __shared__ int block_ids[kChunkTokens];
  __shared__ float row_max[ROWS], row_sum[ROWS], row_alpha[ROWS];
  using R = Raw<DT>;
  constexpr int kUnroll = R::kUnroll;

  const int seq = blockIdx.z;
  const int kvh = blockIdx.y / plan.num_splits, split = blockIdx.y % plan.num_splits;
  const int group = a.num_heads / a.num_kv_heads;
  const int qlen = a.query_len[seq], ctx = a.context_len[seq], q0 = a.query_start[seq];
  const int r0 = blockIdx.x * ROWS;
  if (r0 >= qlen * group) return;
  const int nrows = min(ROWS, qlen * group - r0);
  const int d = a.head_dim;
  const int lanes = d / kVec, slots = kThreads / lanes;
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
  if (threadIdx.x < ROWS) {
    row_max[threadIdx.x] = -INFINITY;
    row_sum[threadIdx.x] = 0.0f;
  }
  float acc[ROWS][kVec];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
#pragma unroll
    for (int i = 0; i < kVec; ++i) acc[r][i] = 0.0f;
  }
  const int32_t* table = a.block_tables + seq * a.max_blocks_per_seq;
  const int bs = a.block_size;
  float* logits = smem;

  for (int c_start = t_begin; c_start < t_end; c_start += kChunkTokens) {
    const int n = min(kChunkTokens, t_end - c_start);
    __syncthreads();  // the previous chunk's readers of block_ids and logits are done
    for (int i = threadIdx.x; i < (n + bs - 1) / bs; i += kThreads) {
      block_ids[i] = table[c_start / bs + i];
    }
    __syncthreads();

    // Logits: each group of `lanes` threads takes one token row of K.
    for (int base = slot; base < n; base += kUnroll * slots) {
      R raw[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int t = base + u * slots;
        if (t < n) {
          const int64_t bh = static_cast<int64_t>(block_ids[t / bs]) * a.num_kv_heads + kvh;
          LoadRaw<DT>(a.k + (bh * bs + t % bs) * a.k_layout.row_bytes, c0, raw[u]);
        } else {
#pragma unroll
          for (int w = 0; w < R::kWords; ++w) raw[u].w[w] = 0;
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int t = base + u * slots;
        float x[kVec];
        Unpack<DT>(raw[u], x);
        if (t < n) {
          const int64_t bh = static_cast<int64_t>(block_ids[t / bs]) * a.num_kv_heads + kvh;
          Scale<DT>(a.k_layout, a.k_scales, bh, t % bs, d, c0, x);
        }
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
          float dot = 0.0f;
#pragma unroll
          for (int i = 0; i < kVec; ++i) dot += q[r][i] * x[i];
          for (int o = lanes / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
          if (li == 0 && t < n) {
            logits[r * kChunkTokens + t] = c_start + t < visible[r] ? dot : -INFINITY;
          }
        }
      }
    }
    __syncthreads();

    // Online softmax over chunks: warp w keeps rows w, w + kWarps, ...
    for (int r = warp; r < ROWS; r += kWarps) {
      float* lr = logits + r * kChunkTokens;
      float mx = -INFINITY;
      for (int t = lane; t < n; t += 32) mx = fmaxf(mx, lr[t]);
      for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      const float m_old = row_max[r], m_new = fmaxf(m_old, mx);
      float sum = 0.0f;
      for (int t = lane; t < n; t += 32) {
        const float p = m_new == -INFINITY ? 0.0f : __expf(lr[t] - m_new);
        lr[t] = p;
        sum += p;
      }
      for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      if (lane == 0) {
        const float alpha = m_old == -INFINITY ? 0.0f : __expf(m_old - m_new);
        row_alpha[r] = alpha;
        row_sum[r] = row_sum[r] * alpha + sum;
        row_max[r] = m_new;
      }
    }
    __syncthreads();

    // Values: the same token split; each thread sums its tokens' rows for its 8 channels.
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const float alpha = row_alpha[r];
#pragma unroll
      for (int i = 0; i < kVec; ++i) acc[r][i] *= alpha;
    }
    for (int base = slot; base < n; base += kUnroll * slots) {
      R raw[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int t = base + u * slots;
        if (t < n) {
          const int64_t bh = static_cast<int64_t>(block_ids[t / bs]) * a.num_kv_heads + kvh;
          LoadRaw<DT>(a.v + (bh * bs + t % bs) * a.v_layout.row_bytes, c0, raw[u]);
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int t = base + u * slots;
        if (t >= n) continue;
        float x[kVec];
        Unpack<DT>(raw[u], x);
        const int64_t bh = static_cast<int64_t>(block_ids[t / bs]) * a.num_kv_heads + kvh;
        Scale<DT>(a.v_layout, a.v_scales, bh, t % bs, d, c0, x);
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
          const float p = logits[r * kChunkTokens + t];
#pragma unroll
          for (int i = 0; i < kVec; ++i) acc[r][i] += p * x[i];
        }
      }
    }
  }

  // Sum the token slots: first the slots inside a warp, then the warps through shared memory.
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      for (int o = lanes; o < 32; o <<= 1) acc[r][i] += __shfl_xor_sync(0xffffffffu, acc[r][i], o);
    }
  }
  __syncthreads();
  float* red = smem;
  if (lane < lanes) {
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
#pragma unroll
      for (int i = 0; i < kVec; ++i) red[(warp * ROWS + r) * d + c0 + i] = acc[r][i];
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < nrows * d; e += kThreads) {
    const int r = e / d, c = e % d;
    float v = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) v += red[(w * ROWS + r) * d + c];
    const int j = (r0 + r) / group, head = kvh * group + (r0 + r) % group;
    const float sum = row_sum[r];
    if (plan.num_splits == 1) {
      a.out[(static_cast<int64_t>(q0 + j) * a.num_heads + head) * d + c] = v / sum;
    } else {
      const int64_t idx = ((static_cast<int64_t>(seq) * a.max_query_len + j) * a.num_heads + head) *
                              plan.num_splits +
                          split;
      tmp_out[idx * d + c] = sum > 0.0f ? v / sum : 0.0f;
      if (c == 0) {
        tmp_ms[2 * idx] = row_max[r];
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

template <KvDType DT, int ROWS>
void Launch(const AttnArgs& a, const AttnPlan& plan, float* tmp_out, float* tmp_ms,
            cudaStream_t stream) {
  const size_t smem = sizeof(float) * std::max<size_t>(size_t{ROWS} * kChunkTokens,
                                                       size_t{kWarps} * ROWS * a.head_dim);
  // At most 32 KiB (ROWS 8, head_dim 256): within the default limit, no opt-in needed.
  const dim3 grid(plan.row_tiles, a.num_kv_heads * plan.num_splits, a.num_seqs);
  PagedAttentionKernel<DT, ROWS><<<grid, kThreads, smem, stream>>>(a, plan, tmp_out, tmp_ms);
  KVSERVE_CUDA_CHECK_LAUNCH();
}

template <KvDType DT>
void LaunchRows(const AttnArgs& a, const AttnPlan& plan, float* tmp_out, float* tmp_ms,
                cudaStream_t stream) {
  if (plan.rows_per_block == 4) {
    Launch<DT, 4>(a, plan, tmp_out, tmp_ms, stream);
  } else {
    Launch<DT, 8>(a, plan, tmp_out, tmp_ms, stream);
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
    if (l->granularity == KvGranularity::kPerGroup && l->group_size % kVec != 0) {
      return "per-group sizes must be multiples of 8";
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
      int64_t{std::max(num_sms, 1)} * (min_blocks_per_sm > 0 ? min_blocks_per_sm : 32);
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
