// Decode attention built for the memory roofline (launcher: paged_attention_pipelined.cu): a
// block serves the at most 8 query rows of one sequence that read one KV head (a GQA group's
// heads, then the group's next query tokens) over one split of the context. It is a pipeline:
//
// - K / V tiles of kTileTokens tokens are copied global → shared with 16-byte cp.async, raw
//   bytes whatever the format, kStages stages deep (sized in bytes: PipelineShape), K and V in
//   separate commit groups, tokens past the split zero-filled instead of branched around; each
//   thread reads the block-table entries of its rows into registers a tile ahead (the first
//   stages' all at once), so no copy waits for more than its own latency.
// - "Swap A/B": the tensor core's M side is 16 tokens of a warp's quarter of the tile and its
//   N side the 8 query rows, so no M row is wasted on a GQA group of 4 or 8 (mma.sync m16n8k16,
//   float32 accumulation). Scores are S^T = K · Q^T, outputs O^T = V^T · P^T; the query sits in
//   registers as B fragments for the whole kernel, P^T reaches its B fragment by two movmatrix
//   per 16 tokens.
// - fp16 / bf16 K and V come from shared memory by ldmatrix (V with .trans). Quantized K (per
//   token) is multiplied as its codes, its scale (and int4 minimum) applied to the scores as in
//   paged_attention_mma.cuh; quantized V (per token) is multiplied as codes too, its scale folded
//   into P and int4's minimum added per row at the end. Since the order of a dot product's
//   terms is free, the channels a lane reads contiguously are the ones it multiplies (the
//   query's channels follow), and O^T's rows are a permutation of the channels undone at the
//   store (VChannel).
// - Each warp keeps its own online softmax over its 16 tokens of every tile; the four are merged
//   at the end (CombineWarps), or written as the split's partial result; the last block of a
//   split sequence's KV head to finish merges the splits (MergeSplits), counted by a counter per
//   (sequence, KV head) that is zero between launches.
//
// Shared memory rows are XOR-swizzled in 16-byte chunks (Swizzle) so that the warps' reads hit
// distinct banks. Device code only; tests/kernels/attention_emulation_test.cc runs it on the
// CPU (cp.async groups, ldmatrix and movmatrix emulated).
#ifndef KVSERVE_KERNELS_CUDA_ATTENTION_PAGED_ATTENTION_PIPELINED_CUH_
#define KVSERVE_KERNELS_CUDA_ATTENTION_PAGED_ATTENTION_PIPELINED_CUH_

#include "kernels/cuda/attention/paged_attention_mma.cuh"
#include "kernels/cuda/device/async_copy.cuh"

namespace kvserve::kernels::cuda::attention {

constexpr int kTileTokens = 64;    // tokens per stage: 16 per warp
constexpr int kPipelinedRows = 8;  // query rows per block: the mma's N

__host__ __device__ constexpr int RowBytes(KvDType dt, int hd) {
  return dt == KvDType::kInt4 ? hd / 2 : IsQuantized(dt) ? hd : 2 * hd;
}

// The sizes of one instantiation's pipeline.
template <KvDType DT, int HD>
struct PipelineShape {
  static constexpr bool kQuantized = IsQuantized(DT);
  static constexpr int kRowBytes = RowBytes(DT, HD);
  static constexpr int kChunks = kRowBytes / 16;  // 16-byte chunks of a row
  static constexpr int kParamBytes = !kQuantized ? 0 : DT == KvDType::kInt4 ? 4 : 2;  // per token
  static constexpr int kKvBytes = kTileTokens * kRowBytes;       // K or V of a stage
  static constexpr int kScaleBytes = kTileTokens * kParamBytes;  // their parameters
  static constexpr int kStageBytes = 2 * kKvBytes + 2 * kScaleBytes;
  // About 64 KiB per block, at least 3 stages (2 in flight while one is read), at most 8.
  static constexpr int kStages = (64 << 10) / kStageBytes < 3   ? 3
                                 : (64 << 10) / kStageBytes > 8 ? 8
                                                                : (64 << 10) / kStageBytes;
  static constexpr int kReductionBytes = kWarps * kPipelinedRows * HD * 4;  // CombineWarps' input
  static constexpr int kSharedBytes =
      kStages * kStageBytes > kReductionBytes ? kStages* kStageBytes : kReductionBytes;
  // The copies a thread issues per stage for K (and as many for V): rows per thread.
  static constexpr int kRowStep = kThreads / kChunks;
  static constexpr int kRowsPerThread = kTileTokens / kRowStep;
  static_assert(kChunks >= 2 && kThreads % kChunks == 0 && kRowsPerThread >= 1);
};

// Where logical 16-byte chunk `c` of stage row `row` is stored. fp16 / bf16 rows are read by
// ldmatrix, 8 rows at one chunk: XOR by row % 8. Quantized K rows are read 16 bytes per lane,
// rows g and g + 1 of a warp's quarter in one phase: XOR rows apart by 4 chunks. Quantized V rows
// are read 4 bytes per lane from rows 2t (t = 0..3) at once: XOR by 2·((row / 2) % 4).
template <KvDType DT, int HD, bool V>
__device__ __forceinline__ int Swizzle(int row, int c) {
  constexpr int kChunks = PipelineShape<DT, HD>::kChunks;
  if constexpr (!IsQuantized(DT)) {
    return c ^ (row & 7);
  } else if constexpr (!V) {
    return kChunks >= 8 ? c ^ ((row & 1) << 2) : c;
  } else {
    return kChunks >= 8   ? c ^ (((row >> 1) & 3) << 1)
           : kChunks == 4 ? c ^ ((row >> 1) & 1) << 1
                          : c;
  }
}

// Quantized K: bytes a lane reads of a row at once, and the channel its k-step `s` (of the load
// at `group`) puts at register half h, element e. Lane t reads bytes LB·(4·group + t).
template <KvDType DT, int HD>
struct QuantizedK {
  static constexpr int kRowBytes = RowBytes(DT, HD);
  static constexpr int kLoadBytes = kRowBytes / 4 < 16 ? kRowBytes / 4 : 16;  // LB
  static constexpr int kGroups = kRowBytes / (4 * kLoadBytes);
  static constexpr int kPerByte = DT == KvDType::kInt4 ? 2 : 1;  // channels
  static constexpr int kSteps = kLoadBytes * kPerByte / 4;       // k-steps of a load
  __host__ __device__ static constexpr int Channel(int group, int t, int s, int h, int e) {
    return (kLoadBytes * (4 * group + t)) * kPerByte + 4 * s + 2 * h + e;
  }
};

// The channel that row m (0..15) of O^T's m-tile `mt` holds: fp16 / bf16 in order; 8-bit codes
// as read, a 4-byte word of 4 channels per lane g per 32-byte group; int4 a word of 8.
template <KvDType DT>
__host__ __device__ constexpr int VChannel(int mt, int m) {
  const int g = m % 8, upper = m / 8;
  if constexpr (!IsQuantized(DT)) {
    return 16 * mt + m;
  } else if constexpr (DT == KvDType::kInt4) {
    return 64 * (mt / 4) + 8 * g + 2 * (mt % 4) + upper;
  } else {
    return 32 * (mt / 2) + 4 * g + 2 * (mt % 2) + upper;
  }
}

// One tile's shared memory: K rows, V rows, then their per-token parameters.
template <KvDType DT, int HD>
struct StageView {
  using S = PipelineShape<DT, HD>;
  uint8_t* base;
  __device__ uint8_t* K() const { return base; }
  __device__ uint8_t* V() const { return base + S::kKvBytes; }
  __device__ uint8_t* KParams() const { return base + 2 * S::kKvBytes; }
  __device__ uint8_t* VParams() const { return base + 2 * S::kKvBytes + S::kScaleBytes; }
};

// BYTES (4, 8 or 16) of shared memory at `p` (aligned to BYTES) as words: one load.
template <int BYTES>
__device__ __forceinline__ void LoadWords(const uint8_t* p, uint32_t (&w)[BYTES / 4]) {
  if constexpr (BYTES == 16) {
    const uint4 x = *reinterpret_cast<const uint4*>(p);
    w[0] = x.x, w[1] = x.y, w[2] = x.z, w[3] = x.w;
  } else if constexpr (BYTES == 8) {
    const uint2 x = *reinterpret_cast<const uint2*>(p);
    w[0] = x.x, w[1] = x.y;
  } else {
    w[0] = *reinterpret_cast<const uint32_t*>(p);
  }
}

struct TokenParam {
  float scale, minimum;
};

// The fp16 scale (and minimum, int4) of token row `row` of a stage's parameters.
template <KvDType DT>
__device__ __forceinline__ TokenParam TokenParams(const uint8_t* params, int row) {
  if constexpr (DT == KvDType::kInt4) {
    const uint32_t w = *reinterpret_cast<const uint32_t*>(params + 4 * row);
    return {DevF16Value(static_cast<uint16_t>(w & 0xffffu)),
            DevF16Value(static_cast<uint16_t>(w >> 16))};
  } else {
    return {DevF16Value(*reinterpret_cast<const uint16_t*>(params + 2 * row)), 0.0f};
  }
}

// The split merge, fused: run by the last block of a (sequence, KV head) to finish its split,
// once every split's partial result (CombineWarps: normalised row, maximum, sum) is visible.
// Warp w merges rows w and w + kWarps side by side, its lanes over the channels (HD / 32
// contiguous each, in 8-byte loads): first the splits' maximum (lanes over the splits),
// then the rows weighted by exp(m_s - m)·sum_s, several splits' loads in flight at once. A
// split that saw no token weighs 0 (its row is zeros). Loads bypass L1 (__ldcg): other SMs
// wrote these.
template <int HD>
__device__ __forceinline__ void MergeSplits(const AttnArgs& a, int num_splits, int seq, int kvh,
                                            int nrows, const float* tmp_out, const float* tmp_ms) {
  constexpr int kPerLane = HD / 32;  // 2, 4 or 8 channels
  constexpr int kRows = kPipelinedRows / kWarps;
  static_assert(kRows == 2, "rows w and w + kWarps per warp");
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = a.num_heads / a.num_kv_heads;
  if (warp >= nrows) return;
  const int rows = warp + kWarps < nrows ? 2 : 1;
  int64_t base[kRows];
  float m[kRows], total[kRows], acc[kRows][kPerLane];
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    const int r = i < rows ? warp + i * kWarps : warp;  // a missing row repeats the first
    const int j = r / group, head = kvh * group + r % group;
    base[i] = ((static_cast<int64_t>(seq) * a.max_query_len + j) * a.num_heads + head) * num_splits;
    m[i] = -INFINITY;
    for (int s = lane; s < num_splits; s += 32) {
      m[i] = fmaxf(m[i], __ldcg(tmp_ms + 2 * (base[i] + s)));
    }
    m[i] = WarpReduce(m[i], [](float x, float y) { return fmaxf(x, y); });
    total[i] = 0.0f;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) acc[i][k] = 0.0f;
  }
#pragma unroll 4
  for (int s = 0; s < num_splits; ++s) {
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const float2 ms = __ldcg(reinterpret_cast<const float2*>(tmp_ms) + base[i] + s);
      const float w = ms.y > 0.0f ? __expf(ms.x - m[i]) * ms.y : 0.0f;
      total[i] += w;
      const float* row = tmp_out + (base[i] + s) * HD + lane * kPerLane;
#pragma unroll
      for (int k = 0; k < kPerLane; k += 2) {
        const float2 v = __ldcg(reinterpret_cast<const float2*>(row + k));
        acc[i][k] += w * v.x;
        acc[i][k + 1] += w * v.y;
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    if (i >= rows) break;
    const int r = warp + i * kWarps, j = r / group, head = kvh * group + r % group;
    const int64_t out_at =
        (static_cast<int64_t>(a.query_start[seq] + j) * a.num_heads + head) * HD + lane * kPerLane;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      StoreOut(a, out_at + k, total[i] > 0.0f ? acc[i][k] / total[i] : 0.0f);
    }
  }
}

template <KvDType DT, int HD>
__global__ void __launch_bounds__(kThreads)
    PagedAttentionPipelinedKernel(AttnArgs a, AttnPlan plan, float* tmp_out, float* tmp_ms,
                                  unsigned* split_counters) {
  using S = PipelineShape<DT, HD>;
  using QK = QuantizedK<DT, HD>;
  // kStages stages; CombineWarps' input at the end. Declared as uint4: 16-byte aligned.
  KVSERVE_DYNAMIC_SHARED(uint4, smem_words);
  uint8_t* const smem = reinterpret_cast<uint8_t*>(smem_words);
  KVSERVE_SHARED(float[kWarps][kPipelinedRows], red_m);
  KVSERVE_SHARED(float[kWarps][kPipelinedRows], red_l);
  KVSERVE_SHARED(unsigned, merging);  // split: whether this block merges the splits
  constexpr bool kBf16 = DT == KvDType::kBf16;
  constexpr bool kQuant = S::kQuantized;
  constexpr int kSteps = HD / 16;  // k-steps of QK, m-tiles of PV
  const int seq = blockIdx.z;
  const int kvh = blockIdx.y / plan.num_splits, split = blockIdx.y % plan.num_splits;
  const int group = a.num_heads / a.num_kv_heads;
  const int qlen = a.query_len[seq], ctx = a.context_len[seq], q0 = a.query_start[seq];
  const int nrows = qlen * group;  // <= kPipelinedRows (the plan's condition)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int t_begin = split * plan.split_tokens;
  const int t_end = min(ctx, t_begin + plan.split_tokens);
  const int num_tiles = t_end > t_begin ? (t_end - t_begin + kTileTokens - 1) / kTileTokens : 0;
  const int32_t* table = a.block_tables + seq * a.max_blocks_per_seq;
  const int bs_shift = __ffs(a.block_size) - 1, bs_mask = a.block_size - 1;

  // --- The producer: this thread's rows of every stage, its chunk column, its parameter copy.
  const int col = threadIdx.x % S::kChunks, row0 = threadIdx.x / S::kChunks;
  // Per-token parameters: 8-bit formats copy a token pair (4 bytes) per thread, threads 0..31
  // for K and 32..63 for V; int4 one token per thread, 0..63 K and 64..127 V.
  const bool param_v = S::kParamBytes == 2 ? threadIdx.x >= 32 : threadIdx.x >= 64;
  const bool param_copier = kQuant && (S::kParamBytes == 4 || threadIdx.x < 64);
  const int param_row = S::kParamBytes == 2 ? 2 * (threadIdx.x % 32) : threadIdx.x % 64;
  struct Pages {  // a tile's block-table entries for this thread's rows and parameter copy
    int32_t rows[S::kRowsPerThread];
    int32_t param;
  };
  const auto load_pages = [&](int tile, Pages& p) {
    const int base = t_begin + tile * kTileTokens;
#pragma unroll
    for (int k = 0; k < S::kRowsPerThread; ++k) {
      const int tok = base + row0 + k * S::kRowStep;
      p.rows[k] = tile < num_tiles && tok < t_end ? __ldg(table + (tok >> bs_shift)) : 0;
    }
    const int tok = base + param_row;
    p.param =
        param_copier && tile < num_tiles && tok < t_end ? __ldg(table + (tok >> bs_shift)) : 0;
  };
  // Copies tile `tile` into its stage (two commit groups: K, then V). Past the last tile only
  // the (empty) groups, so that every thread counts the same groups.
  const auto issue = [&](int tile, const Pages& pages) {
    const StageView<DT, HD> st{smem + (tile % S::kStages) * S::kStageBytes};
    const int base = t_begin + tile * kTileTokens;
#pragma unroll
    for (int kv = 0; kv < 2; ++kv) {
      if (tile < num_tiles) {
        const uint8_t* src_base = kv == 0 ? a.k : a.v;
        uint8_t* dst_base = kv == 0 ? st.K() : st.V();
#pragma unroll
        for (int k = 0; k < S::kRowsPerThread; ++k) {
          const int row = row0 + k * S::kRowStep, tok = base + row;
          const int64_t bh = static_cast<int64_t>(pages.rows[k]) * a.num_kv_heads + kvh;
          const uint8_t* src =
              src_base + ((bh << bs_shift) + (tok & bs_mask)) * S::kRowBytes + 16 * col;
          const int c =
              kv == 0 ? Swizzle<DT, HD, false>(row, col) : Swizzle<DT, HD, true>(row, col);
          CopyAsync<16>(dst_base + row * S::kRowBytes + 16 * c, tok < t_end ? src : a.k,
                        tok < t_end);
        }
        if (param_copier && param_v == (kv == 1)) {
          const int tok = base + param_row;
          const int64_t bh = static_cast<int64_t>(pages.param) * a.num_kv_heads + kvh;
          const DevKvLayout& l = kv == 0 ? a.k_layout : a.v_layout;
          const uint16_t* src = (kv == 0 ? a.k_scales : a.v_scales) + bh * l.scale_entries +
                                (tok & bs_mask) * l.params;
          uint8_t* dst = (kv == 0 ? st.KParams() : st.VParams()) + param_row * S::kParamBytes;
          CopyAsync<4>(dst, tok < t_end ? static_cast<const void*>(src) : a.k, tok < t_end);
        }
      }
      CommitCopies();
    }
  };
  // The first stages' table entries are read at once (one round trip, not one per stage), then
  // their copies go out, all before the query is read.
  {
    Pages first[S::kStages - 1];
#pragma unroll
    for (int p = 0; p < S::kStages - 1; ++p) load_pages(p, first[p]);
#pragma unroll
    for (int p = 0; p < S::kStages - 1; ++p) issue(p, first[p]);
  }
  Pages next;  // the entries of the next tile to copy, read a tile ahead
  load_pages(S::kStages - 1, next);

  // --- The query as B fragments (k: channels, n: row g), scaled; int4 codes with per-token
  // parameters put the odd channels at 16×, so those query channels take 1/16.
  const float odd_factor = DT == KvDType::kInt4 ? 0.0625f : 1.0f;
  uint32_t qb[kSteps][2];
  {
    const float* qr = nullptr;
    if (g < nrows) {
      const int j = g / group, head = kvh * group + g % group;
      qr = a.q + static_cast<int64_t>(q0 + j) * a.q_stride + head * HD;
    }
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        int c = 16 * s + 8 * h + 2 * t;  // ldmatrix's order
        if constexpr (kQuant) {
          c = QK::Channel(s / QK::kSteps, t, s % QK::kSteps, h, 0);
        }
        const float x0 = qr != nullptr ? qr[c] * a.scale : 0.0f;
        const float x1 = qr != nullptr ? qr[c + 1] * a.scale * odd_factor : 0.0f;
        qb[s][h] = Pack<kBf16>(x0, x1);
      }
    }
  }
  // fold_k: per column (rows 2t, 2t + 1) the query's product with the codes' offsets, which the
  // scores start below, and the sum of its channels (int4's minimum times it is added), both
  // from the mma on constant A fragments, so equal to what the QK mma adds up to rounding.
  float bias[2] = {0.0f, 0.0f}, qsum[2] = {0.0f, 0.0f};
  if constexpr (kQuant && DT != KvDType::kFp8E4M3) {
    constexpr uint32_t kOff =
        DT == KvDType::kInt8 ? half_pairs::kInt8Offset : half_pairs::kInt4Bias;
    const uint32_t off[4] = {kOff, kOff, kOff, kOff};
    constexpr uint32_t kUn = half_pairs::kInt4Unscale;
    const uint32_t un[4] = {kUn, kUn, kUn, kUn};
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f}, n[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      Mma<kBf16>(c, off, qb[s][0], qb[s][1]);
      if constexpr (DT == KvDType::kInt4) Mma<kBf16>(n, un, qb[s][0], qb[s][1]);
    }
    bias[0] = c[0], bias[1] = c[1], qsum[0] = n[0], qsum[1] = n[1];
  }
  int visible[2];  // per column 2t + e: the tokens its row may see
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const int n = 2 * t + e;
    visible[e] = n < nrows ? ctx - qlen + n / group + 1 : 0;
  }

  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, vmin[2] = {0.0f, 0.0f};
  float o[kSteps][4];  // O^T m-tile mt: (row g: column 2t, 2t+1), (row g + 8: same)
#pragma unroll
  for (int mt = 0; mt < kSteps; ++mt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) o[mt][e] = 0.0f;
  }
  const int wrow = 16 * warp;  // this warp's first row of a stage

  for (int tile = 0; tile < num_tiles; ++tile) {
    const StageView<DT, HD> st{smem + (tile % S::kStages) * S::kStageBytes};
    const int base = t_begin + tile * kTileTokens + wrow;
    WaitCopies<2 * S::kStages - 3>();  // this tile's K (its V and later tiles may be in flight)
    __syncthreads();                   // ... every thread's; and the oldest stage is read
    issue(tile + S::kStages - 1, next);
    load_pages(tile + S::kStages, next);

    // Scores S^T (16 tokens × 8 columns): element e is token g + 8·(e / 2), column 2t + e % 2.
    float s[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) s[e] = -bias[e & 1];
    if constexpr (!kQuant) {
#pragma unroll
      for (int ks = 0; ks < kSteps; ++ks) {
        const int r = wrow + lane % 8 + 8 * ((lane / 8) & 1), c = 2 * ks + lane / 16;
        uint32_t ka[4];
        LoadMatrices<false>(st.K() + r * S::kRowBytes + 16 * Swizzle<DT, HD, false>(r, c), ka);
        Mma<kBf16>(s, ka, qb[ks][0], qb[ks][1]);
      }
    } else {
#pragma unroll
      for (int grp = 0; grp < QK::kGroups; ++grp) {
        uint32_t w[2][QK::kLoadBytes / 4];  // rows g, g + 8
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
          const int r = wrow + g + 8 * rr, byte = QK::kLoadBytes * (4 * grp + t);
          const int c = Swizzle<DT, HD, false>(r, byte / 16);
          LoadWords<QK::kLoadBytes>(st.K() + r * S::kRowBytes + 16 * c + byte % 16, w[rr]);
        }
#pragma unroll
        for (int ss = 0; ss < QK::kSteps; ++ss) {
          uint32_t ka[4];
#pragma unroll
          for (int rr = 0; rr < 2; ++rr) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              if constexpr (DT == KvDType::kInt8) {
                ka[rr + 2 * h] = half_pairs::Int8PairBiased(w[rr][ss], h);
              } else if constexpr (DT == KvDType::kFp8E4M3) {
                ka[rr + 2 * h] = Bits(__half2(__nv_cvt_fp8x2_to_halfraw2(
                    static_cast<__nv_fp8x2_storage_t>(w[rr][ss] >> (16 * h)), __NV_E4M3)));
              } else {
                ka[rr + 2 * h] = half_pairs::Int4PairBiased(w[rr][ss / 2], 2 * (ss % 2) + h);
              }
            }
          }
          const int ks = grp * QK::kSteps + ss;
          Mma<kBf16>(s, ka, qb[ks][0], qb[ks][1]);
        }
      }
    }
    if constexpr (kQuant) {  // the tokens' K parameters
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        const TokenParam p = TokenParams<DT>(st.KParams(), wrow + g + 8 * rr);
#pragma unroll
        for (int e = 0; e < 2; ++e) s[2 * rr + e] = s[2 * rr + e] * p.scale + p.minimum * qsum[e];
      }
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int tok = base + g + 8 * (e >> 1);
      if (tok >= t_end || tok >= visible[e & 1]) s[e] = -INFINITY;
    }
    // Online softmax per column: the 8 lanes of a column (same t) share its maximum.
    float alpha[2] = {1.0f, 1.0f};
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float mx = fmaxf(s[e], s[e + 2]);
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
      const float m_new = fmaxf(m[e], mx);
      if (m_new == -INFINITY) {  // nothing visible yet for this column
        s[e] = s[e + 2] = 0.0f;
        continue;
      }
      alpha[e] = __expf(m[e] - m_new);
      l[e] *= alpha[e];
      vmin[e] *= alpha[e];
      m[e] = m_new;
      s[e] = __expf(s[e] - m_new);
      s[e + 2] = __expf(s[e + 2] - m_new);
      l[e] += s[e] + s[e + 2];
    }
    if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
      for (int mt = 0; mt < kSteps; ++mt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) o[mt][e] *= alpha[e & 1];
      }
    }

    WaitCopies<2 * S::kStages - 2>();  // this tile's V
    __syncthreads();
    // V's scale folds into P; int4's minimum adds p·min per column. A token past the split
    // (p = 0) may share its parameter copy with the last one and see another's parameters:
    // they must not turn its 0 into NaN.
    if constexpr (kQuant) {
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        const TokenParam p = TokenParams<DT>(st.VParams(), wrow + g + 8 * rr);
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          if (s[2 * rr + e] == 0.0f) continue;
          vmin[e] += s[2 * rr + e] * p.minimum;
          s[2 * rr + e] *= p.scale;
        }
      }
    }
    // P^T as B fragments (k: tokens 2t, 2t+1 and 8 + those; n: column g).
    const uint32_t pb0 = Transpose8x8(Pack<kBf16>(s[0], s[1]));
    const uint32_t pb1 = Transpose8x8(Pack<kBf16>(s[2], s[3]));
    if constexpr (!kQuant) {
#pragma unroll
      for (int mt = 0; mt < kSteps; ++mt) {
        const int r = wrow + lane % 8 + 8 * (lane / 16), c = 2 * mt + ((lane / 8) & 1);
        uint32_t va[4];
        LoadMatrices<true>(st.V() + r * S::kRowBytes + 16 * Swizzle<DT, HD, true>(r, c), va);
        Mma<kBf16>(o[mt], va, pb0, pb1);
      }
    } else {
      // Per 32-byte group of a row: lane g's word of tokens 2t, 2t+1 (A rows g and g + 8 of
      // k 2t, 2t+1) and 2t+8, 2t+9 (k 2t+8, 2t+9).
      constexpr int kTiles = DT == KvDType::kInt4 ? 4 : 2;  // m-tiles per group
#pragma unroll
      for (int grp = 0; grp < S::kRowBytes / 32; ++grp) {
        uint32_t w[4];  // tokens 2t, 2t + 1, 2t + 8, 2t + 9
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int r = wrow + 2 * t + (i & 1) + 8 * (i >> 1), byte = 32 * grp + 4 * g;
          const int c = Swizzle<DT, HD, true>(r, byte / 16);
          w[i] = *reinterpret_cast<const uint32_t*>(st.V() + r * S::kRowBytes + 16 * c + byte % 16);
        }
#pragma unroll
        for (int q = 0; q < kTiles; ++q) {
          uint32_t va[4];  // rows g (channel ... + 0), g + 8 (+ 1); k halves
#pragma unroll
          for (int kh = 0; kh < 2; ++kh) {
            const uint32_t x = w[2 * kh], y = w[2 * kh + 1];
            if constexpr (DT == KvDType::kInt4) {
              uint32_t lo, hi;
              half_pairs::Int4TokenPairs(x, y, q, lo, hi);
              va[2 * kh] = Bits(__hsub2(AsHalf2(lo), AsHalf2(half_pairs::kInt4Bias)));
              va[2 * kh + 1] = Bits(__hfma2(AsHalf2(hi), AsHalf2(half_pairs::kInt4Sixteenth),
                                            AsHalf2(half_pairs::kInt4HighAdd)));
            } else {
              const uint32_t z = half_pairs::InterleaveBytes(x, y, 2 * q);
#pragma unroll
              for (int u = 0; u < 2; ++u) {
                if constexpr (DT == KvDType::kInt8) {
                  va[2 * kh + u] = Bits(__hsub2(AsHalf2(half_pairs::Int8PairBiased(z, u)),
                                                AsHalf2(half_pairs::kInt8Offset)));
                } else {
                  va[2 * kh + u] = Bits(__half2(__nv_cvt_fp8x2_to_halfraw2(
                      static_cast<__nv_fp8x2_storage_t>(z >> (16 * u)), __NV_E4M3)));
                }
              }
            }
          }
          Mma<kBf16>(o[grp * kTiles + q], va, pb0, pb1);
        }
      }
    }
  }

  // --- The warps' states to shared memory, then merged (or the split's partial result).
#pragma unroll
  for (int e = 0; e < 2; ++e) {
#pragma unroll
    for (int x = 4; x < 32; x *= 2) {
      l[e] += __shfl_xor_sync(0xffffffffu, l[e], x);
      vmin[e] += __shfl_xor_sync(0xffffffffu, vmin[e], x);
    }
  }
  WaitCopies<0>();  // the empty tail groups: nothing may land on the reduction below
  __syncthreads();
  float* red = reinterpret_cast<float*>(smem);  // [kWarps][kPipelinedRows][HD]
#pragma unroll
  for (int mt = 0; mt < kSteps; ++mt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int n = 2 * t + (e & 1), ch = VChannel<DT>(mt, g + 8 * (e >> 1));
      red[(warp * kPipelinedRows + n) * HD + ch] = o[mt][e] + vmin[e & 1];
    }
  }
  if (g == 0) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      red_m[warp][2 * t + e] = m[e];
      red_l[warp][2 * t + e] = l[e];
    }
  }
  __syncthreads();
  CombineWarps<kPipelinedRows, HD>(a, plan, red, red_m, red_l, nrows, 0, tmp_out, tmp_ms);
  if (plan.num_splits == 1) return;

  // --- Split: the last of the (sequence, KV head)'s blocks to count itself in merges. Each
  // thread's partial stores are made visible device-wide before the count (fence, barrier,
  // atomic: the order CUDA's threadfence reduction uses); the last block resets the counter
  // for the next launch (or graph replay) and fences again before reading the others'.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned* counter = split_counters + seq * a.num_kv_heads + kvh;
    merging = atomicAdd(counter, 1u) == static_cast<unsigned>(plan.num_splits - 1);
    if (merging) *counter = 0;
  }
  __syncthreads();
  if (!merging) return;
  __threadfence();
  MergeSplits<HD>(a, plan.num_splits, seq, kvh, nrows, tmp_out, tmp_ms);
}

}  // namespace kvserve::kernels::cuda::attention

#endif  // KVSERVE_KERNELS_CUDA_ATTENTION_PAGED_ATTENTION_PIPELINED_CUH_
