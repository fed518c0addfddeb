// Device pieces shared by the paged-attention kernels (paged_attention.cu: SIMT;
// paged_attention_mma.cuh: tensor cores): loading a token row's eight channels in storage form,
// widening and scaling them, online-softmax merging, the final merge of the warps' states, and
// the kernel merging the splits of a split-KV launch.
// Included by those .cu files (and by the CPU emulation test).
#ifndef KVSERVE_KERNELS_CUDA_ATTENTION_ATTENTION_COMMON_CUH_
#define KVSERVE_KERNELS_CUDA_ATTENTION_ATTENTION_COMMON_CUH_

#include <cfloat>
#include <cstdint>

#include "kernels/cuda/attention/paged_attention.h"
#include "kernels/cuda/device/block_reduce.cuh"
#include "kernels/cuda/device/shared_memory.cuh"
#include "kernels/cuda/ops/kv_codec.cuh"

namespace kvserve::kernels::cuda {
namespace attention {

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

// Output element `i` of a finished row: float32 into a.out, or rounded to bf16 / fp16 into
// a.out16 (the O projection's input).
__device__ __forceinline__ void StoreOut(const AttnArgs& a, int64_t i, float v) {
  if (a.out16 == nullptr) {
    a.out[i] = v;
  } else if (a.out16_bf16) {
    a.out16[i] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
  } else {
    a.out16[i] = __half_as_ushort(__float2half_rn(v));
  }
}

// The end of both attention kernels: merges the warps' online-softmax states of `nrows` rows
// (red: [kWarps][ROWS][HD] partial outputs, red_m / red_l: maxima and sums, after a barrier)
// and writes the rows' outputs, or the split's partial result when the context is split.
template <int ROWS, int HD>
__device__ __forceinline__ void CombineWarps(const AttnArgs& a, const AttnPlan& plan,
                                             const float* red, const float (*red_m)[ROWS],
                                             const float (*red_l)[ROWS], int nrows, int r0,
                                             float* tmp_out, float* tmp_ms) {
  constexpr int d = HD;
  const int seq = blockIdx.z;
  const int kvh = blockIdx.y / plan.num_splits, split = blockIdx.y % plan.num_splits;
  const int group = a.num_heads / a.num_kv_heads, q0 = a.query_start[seq];
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
      StoreOut(a, (static_cast<int64_t>(q0 + j) * a.num_heads + head) * d + c, v / sum);
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

constexpr int kCombineThreads = 256;  // the split-merging kernel's block
constexpr int kCombineWarps = kCombineThreads / 32;

// The body of the split-merging kernel (CombineSplitsKernel in paged_attention.cu), grid
// (num_heads, max_query_len, num_seqs), kCombineThreads threads: merges a row's splits by their
// softmax weights. The block first reduces the splits' maxima and weighted sums; then each
// warp takes every kCombineWarps-th split (its lanes across the channels, so the partial rows
// are read coalesced and the splits' loads are independent), and the warps' sums are added in
// shared memory. A split's weight is exp(m_s − m)·sum_s; one that saw no token weighs 0.
__device__ __forceinline__ void CombineSplits(const AttnArgs& a, int num_splits,
                                              const float* tmp_out, const float* tmp_ms) {
  KVSERVE_SHARED(float[kCombineWarps], scratch);
  KVSERVE_SHARED(float[kCombineWarps][256], partial);  // head_dim ≤ 256
  const int head = blockIdx.x, j = blockIdx.y, seq = blockIdx.z;
  if (j >= a.query_len[seq]) return;
  const int64_t base =
      ((static_cast<int64_t>(seq) * a.max_query_len + j) * a.num_heads + head) * num_splits;
  const auto weight = [&](int s, float m) {
    const float sum = tmp_ms[2 * (base + s) + 1];
    return sum > 0.0f ? __expf(tmp_ms[2 * (base + s)] - m) * sum : 0.0f;
  };
  float m = -INFINITY;
  for (int s = threadIdx.x; s < num_splits; s += kCombineThreads) {
    m = fmaxf(m, tmp_ms[2 * (base + s)]);
  }
  m = BlockReduce(m, scratch, [](float x, float y) { return fmaxf(x, y); });
  float total = 0.0f;
  for (int s = threadIdx.x; s < num_splits; s += kCombineThreads) total += weight(s, m);
  total = BlockSum(total, scratch);

  const int d = a.head_dim, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};  // channels lane + 32k
  for (int s = warp; s < num_splits; s += kCombineWarps) {
    const float f = weight(s, m);
    if (f == 0.0f) continue;  // saw no token (or weighs nothing): skip its row
    const float* row = tmp_out + (base + s) * d;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      if (lane + 32 * k < d) acc[k] += f * row[lane + 32 * k];
    }
  }
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    if (lane + 32 * k < d) partial[warp][lane + 32 * k] = acc[k];
  }
  __syncthreads();
  const int64_t out_at = (static_cast<int64_t>(a.query_start[seq] + j) * a.num_heads + head) * d;
  for (int c = threadIdx.x; c < d; c += kCombineThreads) {
    float v = 0.0f;
#pragma unroll
    for (int w = 0; w < kCombineWarps; ++w) v += partial[w][c];
    StoreOut(a, out_at + c, v / total);
  }
}

}  // namespace attention

// The tensor-core kernel (paged_attention_mma.cu): whether it covers `a` (fp16 / bf16 /
// quantized caches, head_dim 64 or 128), and its launch for a plan made with tensor_cores.
bool TensorCoreAttentionCovers(const AttnArgs& a);
void LaunchTensorCoreAttention(const AttnArgs& a, const AttnPlan& plan, float* tmp_out,
                               float* tmp_ms, cudaStream_t stream);
// The pipelined decode kernel's launch (paged_attention_pipelined.cu), for a plan that chose it:
// split, it merges the splits itself, counting in `split_counters` (AttnPlan::split_counters).
void LaunchPipelinedAttention(const AttnArgs& a, const AttnPlan& plan, float* tmp_out,
                              float* tmp_ms, unsigned* split_counters, cudaStream_t stream);

}  // namespace kvserve::kernels::cuda

#endif  // KVSERVE_KERNELS_CUDA_ATTENTION_ATTENTION_COMMON_CUH_
