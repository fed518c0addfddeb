// Device code of the logits adjustments (kernels/logits_processing.h; launcher in
// logits_processing.cu): one thread block per adjusted row. The three steps touch the same
// logits, so the block waits between them; within a step each entry names a distinct id.
#ifndef KVSERVE_KERNELS_CUDA_OPS_LOGITS_PROCESSING_CUH_
#define KVSERVE_KERNELS_CUDA_OPS_LOGITS_PROCESSING_CUH_

#include <cmath>
#include <cstdint>

#include "kernels/logits_processing.h"

namespace kvserve::kernels::cuda::logits {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) AdjustLogitsKernel(AdjustLogitsParams p) {
  const LogitsAdjustment a = p.rows[blockIdx.x];
  auto at = [&](int64_t id) -> float& {
    return p.logits[LogitIndex(p.num_rows, p.vocab, p.shard_vocab, a.row, id)];
  };
  const int32_t num_allowed = a.allowed_end - a.allowed_begin;
  if (num_allowed > 0) {
    const int32_t* allowed = p.allowed_ids + a.allowed_begin;
    for (int64_t id = threadIdx.x; id < p.vocab; id += kThreads) {
      if (!SortedContains(allowed, num_allowed, static_cast<int32_t>(id))) at(id) = -INFINITY;
    }
  }
  if (a.mask_begin >= 0) {
    for (int64_t id = threadIdx.x; id < p.vocab; id += kThreads) {
      if (!MaskAllows(p, a, id)) at(id) = -INFINITY;
    }
  }
  __syncthreads();
  for (int32_t i = a.bias_begin + static_cast<int32_t>(threadIdx.x); i < a.bias_end;
       i += kThreads) {
    float& logit = at(p.biases[i].id);
    logit = Biased(logit, p.biases[i].bias);
  }
  __syncthreads();
  for (int32_t i = a.counts_begin + static_cast<int32_t>(threadIdx.x); i < a.counts_end;
       i += kThreads) {
    const TokenCount c = p.counts[i];
    float& logit = at(c.id);
    logit = Penalized(logit, c, a.repetition_penalty, a.frequency_penalty, a.presence_penalty);
  }
}

}  // namespace kvserve::kernels::cuda::logits

#endif  // KVSERVE_KERNELS_CUDA_OPS_LOGITS_PROCESSING_CUH_
