// The SIMT paged-attention kernel (launchers in paged_attention.cu): every format, head_dim
// 16 / 32 / 64 / 128 / 256 (HD / 8 threads per token), ROWS query rows per block. Device code
// only; the tests also run it on the CPU under tests/testing/cuda_emulator/emulator.h.
#ifndef KVSERVE_KERNELS_CUDA_ATTENTION_PAGED_ATTENTION_SIMT_CUH_
#define KVSERVE_KERNELS_CUDA_ATTENTION_PAGED_ATTENTION_SIMT_CUH_

#include "kernels/cuda/attention/attention_common.cuh"

namespace kvserve::kernels::cuda::attention {

// One pass over the context: each group of LANES threads takes one token at a time (K and V
// rows loaded together, kUnroll tokens in flight) and keeps its own online softmax per row;
// the groups are merged at the end. No barrier inside the loop. HD is head_dim.
template <KvDType DT, int ROWS, int HD>
__global__ void __launch_bounds__(kThreads, ROWS == 4 ? (Raw<DT>::kWords >= 4 ? 4 : 3) : 2)
    PagedAttentionKernel(AttnArgs a, AttnPlan plan, float* tmp_out, float* tmp_ms) {
  KVSERVE_DYNAMIC_SHARED(float, red);  // [kWarps][ROWS][head_dim]
  KVSERVE_SHARED(float[kWarps][ROWS], red_m);
  KVSERVE_SHARED(float[kWarps][ROWS], red_l);
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

}  // namespace kvserve::kernels::cuda::attention

#endif  // KVSERVE_KERNELS_CUDA_ATTENTION_PAGED_ATTENTION_SIMT_CUH_
