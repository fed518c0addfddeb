// Paged attention on tensor cores (mma.sync m16n8k16, float32 accumulation) for fp16 / bf16 and
// quantized caches (dequantized to fp16 in registers), head_dim 64 or 128. A warp computes 16
// query rows of one sequence that read the same KV head (a GQA group's heads, then the group's
// next query tokens) over 16-token steps of the context, with an online softmax. A sequence
// with at most 16 rows (decode): the block's four warps share them and split the steps, their
// states merged at the end like the SIMT kernel's. A longer one (a prefill chunk; the plan then
// gives blocks 64 rows): each warp has its own 16 rows and walks every step up to its last
// visible token; the four warps read the same K / V rows at about the same time, so most of
// those reads hit the L1 cache. The choice is per sequence, so a batch mixing prefill chunks
// and decodes keeps the decodes' token split.
//
// No shared memory in the loop: a thread loads 8 consecutive channels (16 bytes of fp16 /
// bf16) of token g = lane / 4 for every 32-channel chunk, at channel 32·chunk + 8·t
// (t = lane % 4). Because a dot product may take its terms in any order, those 8 channels
// serve directly as the K operand (B fragment) of two m16n8k16 steps, as long as the query (A
// fragment) uses the same channel order. For P·V the tokens are the reduction dimension: each
// of the thread's four 32-bit words (channel pairs) of token g is one element pair of an 8×8
// tile whose rows are the tile's 8 tokens, and movmatrix transposes it in registers into the
// B fragment (rows: channels, pairs: consecutive tokens). The output columns then come back
// to each thread as its own 8 channels. The scores' accumulator fragment is the probabilities'
// A fragment, as in FlashAttention 2.
//
// Quantized K with per-token parameters is not dequantized: QK runs on the codes and each
// score takes its token's scale (and int4's minimum times the query's sum). Two loops: the
// plain one loads a step's K and V and computes; with kPrefetchK the next step's K loads
// during the current step. Block-table entries are read ahead in both.
//
// Device code only (the launchers are in paged_attention_mma.cu); the tests also run it on the
// CPU under tests/testing/cuda_emulator/emulator.h, which stands in for mma.sync and movmatrix.
#ifndef KVSERVE_KERNELS_CUDA_ATTENTION_PAGED_ATTENTION_MMA_CUH_
#define KVSERVE_KERNELS_CUDA_ATTENTION_PAGED_ATTENTION_MMA_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstring>

#include "kernels/cuda/attention/attention_common.cuh"
#include "kernels/cuda/device/half_pairs.h"
#include "kernels/cuda/device/mma_layout.h"

namespace kvserve::kernels::cuda::attention {

constexpr int kMmaRows = 16;
constexpr int kStepTokens = 16;  // tokens per warp step: two 8-token n-tiles of the scores

// The bits of `x` as a `To` of the same size (memcpy: no aliasing questions on the host, a
// register move on the device).
template <typename To, typename From>
__device__ __forceinline__ To BitCast(const From& x) {
  static_assert(sizeof(To) == sizeof(From));
  To y;
  memcpy(static_cast<void*>(&y), &x, sizeof(To));
  return y;
}

// Two floats as the 16-bit pair an mma operand register holds (the first in the low half).
template <bool BF16>
__device__ __forceinline__ uint32_t Pack(float lo, float hi) {
  if constexpr (BF16) {
    return BitCast<uint32_t>(__floats2bfloat162_rn(lo, hi));
  } else {
    return BitCast<uint32_t>(__floats2half2_rn(lo, hi));
  }
}

// c += a · b for one m16n8k16 tile: a holds (row g, k 2t..2t+1), (row g+8, same k),
// (row g, k 2t+8..2t+9), (row g+8, same k); b holds (k 2t..2t+1, n g), (k 2t+8..2t+9, n g);
// c holds (row g, n 2t..2t+1), (row g+8, n 2t..2t+1).
template <bool BF16>
__device__ __forceinline__ void Mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
#if defined(KVSERVE_CUDA_EMULATION)
  ::kvserve::emulation::Mma16816<BF16>(c, a, b0, b1);
#else
  if constexpr (BF16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
#endif
}

// movmatrix: the warp's 8×8 16-bit matrix whose row g = lane / 4 holds lane 4g + t's pair `x`
// at columns 2t and 2t + 1, transposed: lane 4g + t gets row g of the transpose, i.e. the
// original's rows 2t and 2t + 1 of column g.
__device__ __forceinline__ uint32_t Transpose8x8(uint32_t x) {
#if defined(KVSERVE_CUDA_EMULATION)
  return ::kvserve::emulation::MovMatrixTrans(x);
#else
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
#endif
}

__device__ __forceinline__ __half2 AsHalf2(uint32_t bits) { return BitCast<__half2>(bits); }

__device__ __forceinline__ uint32_t Bits(__half2 h) { return BitCast<uint32_t>(h); }

// The eight codes of a quantized row's load as four exact fp16 pairs (half_pairs.h; fp8 by the
// hardware's e4m3x2 → f16x2 conversion).
template <KvDType DT>
__device__ __forceinline__ void CodePairs(const Raw<DT>& r, __half2 (&c)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (DT == KvDType::kInt8) {
      c[i] = __hsub2(AsHalf2(half_pairs::Int8PairBiased(r.w[i / 2], i % 2)),
                     AsHalf2(half_pairs::kInt8Offset));
    } else if constexpr (DT == KvDType::kFp8E4M3) {
      c[i] = __half2(__nv_cvt_fp8x2_to_halfraw2(
          static_cast<__nv_fp8x2_storage_t>(r.w[i / 2] >> (16 * (i % 2))), __NV_E4M3));
    } else {
      c[i] = __hfma2(AsHalf2(half_pairs::Int4PairBiased(r.w[0], i)), AsHalf2(half_pairs::kInt4Mul),
                     AsHalf2(half_pairs::kInt4Add));
    }
  }
}

// The eight codes of a quantized row's load as four fp16 pairs that the K operand takes
// unscaled when K has per-token parameters (the scale is applied to the scores instead): int8
// as 1152 + code, int4 as (1024 + lo, 1024 + 16·hi), fp8 exactly. The query's fragment and
// the scores' starting values absorb the offsets and the 1/16 (see the kernel).
template <KvDType DT>
__device__ __forceinline__ void BiasedCodePairs(const Raw<DT>& r, uint32_t (&w)[4]) {
  if constexpr (DT == KvDType::kFp8E4M3) {
    __half2 c[4];
    CodePairs<DT>(r, c);
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = Bits(c[i]);
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      w[i] = DT == KvDType::kInt8 ? half_pairs::Int8PairBiased(r.w[i / 2], i % 2)
                                  : half_pairs::Int4PairBiased(r.w[0], i);
    }
  }
}

// Channels c0..c0+7 of a token row as four 16-bit pairs in the mma's type: fp16 / bf16 as
// stored; quantized codes as fp16 pairs, then scaled (and offset, int4) in fp16x2 arithmetic —
// one rounding of code·scale (+ min), no float conversions. The parameters are fp16 already:
// per token `token_params` (LoadTokenParams, loaded once per token by the caller), per group
// one (scale, min) word broadcast to both halves; per channel the pairs' own, read as 32-bit
// words (even channel indices, so aligned). kCodes: the biased codes alone (BiasedCodePairs).
template <KvDType DT, bool kCodes>
__device__ __forceinline__ void LoadPairs(const uint8_t* row, const DevKvLayout& l,
                                          const uint16_t* scales, int64_t bh, int off, int d,
                                          int c0, uint32_t token_params, uint32_t (&w)[4]) {
  Raw<DT> r;
  LoadRaw<DT>(row, c0, r);
  if constexpr (DT == KvDType::kFp16 || DT == KvDType::kBf16) {
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = r.w[i];
  } else if constexpr (kCodes) {
    BiasedCodePairs<DT>(r, w);
  } else {
    __half2 c[4];
    CodePairs<DT>(r, c);
    constexpr bool kMin = DT == KvDType::kInt4;
    if (l.granularity == KvGranularity::kPerChannel) {
      const uint32_t* p =
          reinterpret_cast<const uint32_t*>(scales + bh * l.scale_entries + c0 * l.params);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if constexpr (kMin) {  // (scale, min) of channels c0 + 2i and c0 + 2i + 1
          const uint32_t a = __ldg(p + 2 * i), b = __ldg(p + 2 * i + 1);
          w[i] = Bits(__hfma2(c[i], AsHalf2(half_pairs::LowHalves(a, b)),
                              AsHalf2(half_pairs::HighHalves(a, b))));
        } else {
          w[i] = Bits(__hmul2(c[i], AsHalf2(__ldg(p + i))));
        }
      }
    } else {
      const uint32_t params = l.granularity == KvGranularity::kPerGroup
                                  ? LoadTokenParams<DT>(l, scales, bh, off, d, c0)
                                  : token_params;
      const __half2 scale = AsHalf2(half_pairs::Broadcast(params, false));
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if constexpr (kMin) {
          w[i] = Bits(__hfma2(c[i], scale, AsHalf2(half_pairs::Broadcast(params, true))));
        } else {
          w[i] = Bits(__hmul2(c[i], scale));
        }
      }
    }
  }
}

// kPrefetchK: each step's K rows are loaded during the step before (AttnPlan::prefetch_k).
template <KvDType DT, int HD, bool kPrefetchK>
__global__ void __launch_bounds__(kThreads)
    PagedAttentionMmaKernel(AttnArgs a, AttnPlan plan, float* tmp_out, float* tmp_ms) {
  KVSERVE_DYNAMIC_SHARED(float, red);  // decode: [kWarps][kMmaRows][HD]
  KVSERVE_SHARED(float[kWarps][kMmaRows], red_m);
  KVSERVE_SHARED(float[kWarps][kMmaRows], red_l);
  constexpr bool kBf16 = DT == KvDType::kBf16;
  constexpr int kChunks = HD / 32;  // 32-channel chunks: 8 channels of each per thread
  const int seq = blockIdx.z;
  const int kvh = blockIdx.y / plan.num_splits, split = blockIdx.y % plan.num_splits;
  const int group = a.num_heads / a.num_kv_heads;
  const int qlen = a.query_len[seq], ctx = a.context_len[seq], q0 = a.query_start[seq];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  // Rows per warp or per block; the same for the whole block.
  const bool prefill = qlen * group > kMmaRows;
  // This warp's rows [r0, r0 + nrows).
  const int r0 = blockIdx.x * plan.rows_per_block + (prefill ? warp * kMmaRows : 0);
  if (!prefill && blockIdx.x > 0) return;
  if (r0 >= qlen * group) return;  // decode: the whole block; prefill: this warp (no barrier)
  const int nrows = min(kMmaRows, qlen * group - r0);
  // Quantized K with per-token parameters: QK runs on the (biased) codes and the scores take
  // the token's scale, s·(q·code) + min·Σq, instead of dequantizing every element of K.
  const bool fold_k = IsQuantized(DT) && a.k_layout.granularity == KvGranularity::kPerToken;
  // int4's high nibbles arrive as 16·code: their query channels (the odd ones) take 1/16.
  const float odd_factor = DT == KvDType::kInt4 && fold_k ? 0.0625f : 1.0f;

  // The query rows g and g + 8 (scaled), as A fragments: for chunk j and half h, k positions
  // 2t, 2t+1, 2t+8, 2t+9 are channels 32j + 8t + 4h + 0, 1, 2, 3.
  uint32_t qa[kChunks][2][4];
  int visible[2];
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int r = g + 8 * rr;
    const float* qr = nullptr;
    visible[rr] = 0;
    if (r < nrows) {
      const int j = (r0 + r) / group, head = kvh * group + (r0 + r) % group;
      qr = a.q + static_cast<int64_t>(q0 + j) * a.q_stride + head * HD;
      visible[rr] = ctx - qlen + j + 1;
    }
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int c = mma::QueryChannel(t, j, h);
        float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (qr != nullptr) {
#pragma unroll
          for (int i = 0; i < 4; ++i) x[i] = qr[c + i] * a.scale;
        }
        qa[j][h][rr] = Pack<kBf16>(x[0], x[1] * odd_factor);
        qa[j][h][2 + rr] = Pack<kBf16>(x[2], x[3] * odd_factor);
      }
    }
  }
  // For fold_k, per row (g, g + 8): `bias`, the query's product with the codes' offsets (the
  // scores start from −bias), and `qsum`, the sum of its fp16 channels (int4's minimum is
  // added as min·qsum). Both come from the mma itself on constant K fragments, so they are
  // what the QK mma adds to the scores, up to float rounding.
  float bias[2] = {0.0f, 0.0f}, qsum[2] = {0.0f, 0.0f};
  if (fold_k && DT != KvDType::kFp8E4M3) {
    constexpr uint32_t kOffsets =
        DT == KvDType::kInt8 ? half_pairs::kInt8Offset : half_pairs::kInt4Bias;
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f}, n[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        Mma<kBf16>(c, qa[j][h], kOffsets, kOffsets);
        if constexpr (DT == KvDType::kInt4) {
          Mma<kBf16>(n, qa[j][h], half_pairs::kInt4Unscale, half_pairs::kInt4Unscale);
        }
      }
    }
    bias[0] = c[0], bias[1] = c[2], qsum[0] = n[0], qsum[1] = n[2];
  }
  const int last_visible = ctx - qlen + (r0 + nrows - 1) / group + 1;
  const int t_begin = split * plan.chunks_per_split * kChunkTokens;
  const int t_end = min(last_visible, t_begin + plan.chunks_per_split * kChunkTokens);
  const int32_t* table = a.block_tables + seq * a.max_blocks_per_seq;
  const int bs_shift = __ffs(a.block_size) - 1, bs_mask = a.block_size - 1;

  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // rows g, g + 8
  float o[kChunks][4][4];  // [chunk][pair i][c0..c3]: channels 32j + 8t + 2i + {0, 1}
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[j][i][e] = 0.0f;
    }
  }
  // The loop bound is the same for the whole warp: mma, movmatrix and shuffles see it all.
  const int first = prefill ? t_begin : t_begin + warp * kStepTokens;
  const int stride = prefill ? kStepTokens : kWarps * kStepTokens;
  const bool v_per_token = a.v_layout.granularity == KvGranularity::kPerToken;
  using Rows = uint32_t[2][kChunks][4];  // a step's 16 token rows: [tile u][chunk][pair]
  // The block-table entries of tokens g and 8 + g of the step at `step` (0 past the end).
  const auto load_blocks = [&](int step, int32_t(&blocks)[2]) {
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int tok = step + 8 * u + g;
      blocks[u] = tok < t_end ? __ldg(table + (tok >> bs_shift)) : 0;
    }
  };
  // Tokens g and 8 + g of the step at `step`: their K rows into `kw` (biased codes and the
  // tokens' parameters into `kp` for fold_k, else dequantized) and their V rows into `vw`,
  // either may be null; zeros past the end, never NaN (masked scores weigh 0).
  const auto load_rows = [&](int step, const int32_t(&blocks)[2], Rows* kw, uint32_t* kp,
                             Rows* vw) {
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int tok = step + 8 * u + g;
      if (kw != nullptr) kp[u] = 0u;
      if (tok < t_end) {
        const int64_t bh = static_cast<int64_t>(blocks[u]) * a.num_kv_heads + kvh;
        const int off = tok & bs_mask;
        const int64_t row = (bh << bs_shift) + off;
        if (kw != nullptr) {
          const uint8_t* k_row = a.k + row * a.k_layout.row_bytes;
          if (fold_k) kp[u] = LoadTokenParams<DT>(a.k_layout, a.k_scales, bh, off, HD, 0);
#pragma unroll
          for (int j = 0; j < kChunks; ++j) {
            const int c0 = mma::LoadedChannel(t, j, 0);
            if (fold_k) {
              LoadPairs<DT, true>(k_row, a.k_layout, a.k_scales, bh, off, HD, c0, 0u, (*kw)[u][j]);
            } else {
              LoadPairs<DT, false>(k_row, a.k_layout, a.k_scales, bh, off, HD, c0, 0u, (*kw)[u][j]);
            }
          }
        }
        if (vw != nullptr) {
          const uint32_t vp =
              v_per_token ? LoadTokenParams<DT>(a.v_layout, a.v_scales, bh, off, HD, 0) : 0u;
#pragma unroll
          for (int j = 0; j < kChunks; ++j) {
            LoadPairs<DT, false>(a.v + row * a.v_layout.row_bytes, a.v_layout, a.v_scales, bh, off,
                                 HD, mma::LoadedChannel(t, j, 0), vp, (*vw)[u][j]);
          }
        }
      } else {
#pragma unroll
        for (int j = 0; j < kChunks; ++j) {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            if (kw != nullptr) (*kw)[u][j][i] = 0u;
            if (vw != nullptr) (*vw)[u][j][i] = 0u;
          }
        }
      }
    }
  };
  // One 16-token step at `base` on its K rows (and parameters) and V rows: scores, online
  // softmax, P·V.
  const auto compute = [&](int base, const Rows& kw, const uint32_t(&kp)[2], const Rows& vw) {
    // Scores of rows g, g + 8 for tokens base + 8u + 2t + {0, 1}.
    float s[2][4];
#pragma unroll
    for (int u = 0; u < 2; ++u) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[u][e] = -bias[e >> 1];
#pragma unroll
      for (int j = 0; j < kChunks; ++j) {
#pragma unroll
        for (int h = 0; h < 2; ++h)
          Mma<kBf16>(s[u], qa[j][h], kw[u][j][2 * h], kw[u][j][2 * h + 1]);
      }
      if (fold_k) {  // token 2t + e's parameters are with the lanes whose g is 2t + e
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const uint32_t p = __shfl_sync(0xffffffffu, kp[u], 8 * t + 4 * e);
          const float scale = DevF16Value(static_cast<uint16_t>(p & 0xffffu));
          const float minimum =
              DT == KvDType::kInt4 ? DevF16Value(static_cast<uint16_t>(p >> 16)) : 0.0f;
#pragma unroll
          for (int rr = 0; rr < 2; ++rr)
            s[u][2 * rr + e] = s[u][2 * rr + e] * scale + minimum * qsum[rr];
        }
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int tok = base + 8 * u + 2 * t + (e & 1);
        if (tok >= t_end || tok >= visible[e >> 1]) s[u][e] = -INFINITY;
      }
    }
    // Online softmax per row; the four lanes of a row group (same g) share its maximum.
    float alpha[2] = {1.0f, 1.0f};
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      float mx =
          fmaxf(fmaxf(s[0][2 * rr], s[0][2 * rr + 1]), fmaxf(s[1][2 * rr], s[1][2 * rr + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m[rr], mx);
      if (m_new == -INFINITY) {  // nothing visible yet for this row
#pragma unroll
        for (int u = 0; u < 2; ++u) s[u][2 * rr] = s[u][2 * rr + 1] = 0.0f;
        continue;
      }
      alpha[rr] = __expf(m[rr] - m_new);  // 0 when m[rr] is -inf, 1 when the maximum stays
      l[rr] *= alpha[rr];
      m[rr] = m_new;
#pragma unroll
      for (int u = 0; u < 2; ++u) {
#pragma unroll
        for (int e = 2 * rr; e < 2 * rr + 2; ++e) {
          s[u][e] = __expf(s[u][e] - m_new);  // 0 for masked tokens
          l[rr] += s[u][e];
        }
      }
    }
    // The accumulators follow a row's new maximum. Once the maxima settle (most steps of a long
    // context) no row of the warp moves and the 4·HD/8 multiplications by 1 are skipped.
    if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
      for (int j = 0; j < kChunks; ++j) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
#pragma unroll
          for (int e = 0; e < 4; ++e) o[j][i][e] *= alpha[e >> 1];
        }
      }
    }
    // P (rows × the step's 16 tokens) as an A fragment: the scores' accumulator layout.
    const uint32_t pa[4] = {Pack<kBf16>(s[0][0], s[0][1]), Pack<kBf16>(s[0][2], s[0][3]),
                            Pack<kBf16>(s[1][0], s[1][1]), Pack<kBf16>(s[1][2], s[1][3])};
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        Mma<kBf16>(o[j][i], pa, Transpose8x8(vw[0][j][i]), Transpose8x8(vw[1][j][i]));
      }
    }
  };
  // The block-table entries are read a step ahead (two with kPrefetchK), so a step's K / V
  // loads wait for one memory latency, not for the table's and then their own.
  int32_t blocks[2], next_blocks[2];
  load_blocks(first, blocks);
  if constexpr (!kPrefetchK) {
    for (int base = first; base < t_end; base += stride) {
      load_blocks(base + stride, next_blocks);
      Rows kw, vw;
      uint32_t kp[2];
      load_rows(base, blocks, &kw, kp, &vw);
      compute(base, kw, kp, vw);
#pragma unroll
      for (int u = 0; u < 2; ++u) blocks[u] = next_blocks[u];
    }
  } else {
    // K one step ahead: a step's QK starts on rows loaded during the previous step, while its
    // V rows (needed only after the softmax) and the next step's K are in flight. Two K
    // buffers used in turn, so the loop body appears twice.
    Rows k0, k1, vw;
    uint32_t p0[2], p1[2];
    int32_t after_blocks[2];
    load_blocks(first + stride, next_blocks);
    load_rows(first, blocks, &k0, p0, nullptr);
    const auto step = [&](int base, const Rows& k_now, const uint32_t(&p_now)[2], Rows& k_next,
                          uint32_t(&p_next)[2]) {
      load_blocks(base + 2 * stride, after_blocks);
      load_rows(base, blocks, nullptr, nullptr, &vw);
      load_rows(base + stride, next_blocks, &k_next, p_next, nullptr);
      compute(base, k_now, p_now, vw);
#pragma unroll
      for (int u = 0; u < 2; ++u) blocks[u] = next_blocks[u], next_blocks[u] = after_blocks[u];
    };
    for (int base = first; base < t_end; base += 2 * stride) {
      step(base, k0, p0, k1, p1);
      if (base + stride >= t_end) break;
      step(base + stride, k1, p1, k0, p0);
    }
  }

  // Each row's sum is split over the four lanes of its group.
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    l[rr] += __shfl_xor_sync(0xffffffffu, l[rr], 1);
    l[rr] += __shfl_xor_sync(0xffffffffu, l[rr], 2);
  }
  if (prefill) {  // the warp's rows are complete: write them
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const int r = g + 8 * rr;
      if (r >= nrows) continue;
      const int j = (r0 + r) / group, head = kvh * group + (r0 + r) % group;
      float* dst = nullptr;  // a split's partial row; else the output row at out_at
      int64_t out_at = 0;
      const float inv = l[rr] > 0.0f ? 1.0f / l[rr] : 0.0f;
      if (plan.num_splits == 1) {
        out_at = (static_cast<int64_t>(q0 + j) * a.num_heads + head) * HD;
      } else {
        const int64_t idx =
            ((static_cast<int64_t>(seq) * a.max_query_len + j) * a.num_heads + head) *
                plan.num_splits +
            split;
        dst = tmp_out + idx * HD;
        if (t == 0) {
          tmp_ms[2 * idx] = m[rr];
          tmp_ms[2 * idx + 1] = l[rr];
        }
      }
#pragma unroll
      for (int jj = 0; jj < kChunks; ++jj) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int ch = mma::OutputChannel(t, jj, i);
          const float v0 = o[jj][i][2 * rr] * inv, v1 = o[jj][i][2 * rr + 1] * inv;
          if (dst != nullptr) {
            dst[ch] = v0;
            dst[ch + 1] = v1;
          } else {
            StoreOut(a, out_at + ch, v0);
            StoreOut(a, out_at + ch + 1, v1);
          }
        }
      }
    }
    return;
  }
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int r = g + 8 * rr;
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float* dst = red + (warp * kMmaRows + r) * HD + mma::OutputChannel(t, j, i);
        dst[0] = o[j][i][2 * rr];
        dst[1] = o[j][i][2 * rr + 1];
      }
    }
    if (t == 0) {
      red_m[warp][r] = m[rr];
      red_l[warp][r] = l[rr];
    }
  }
  __syncthreads();
  CombineWarps<kMmaRows, HD>(a, plan, red, red_m, red_l, nrows, r0, tmp_out, tmp_ms);
}

}  // namespace kvserve::kernels::cuda::attention

#endif  // KVSERVE_KERNELS_CUDA_ATTENTION_PAGED_ATTENTION_MMA_CUH_
