// Launcher of the logits adjustments (the kernel: logits_processing.cuh).
#include "kernels/cuda/device/launch.cuh"
#include "kernels/cuda/ops/logits_processing.cuh"
#include "kernels/cuda/ops/logits_processing.h"

namespace kvserve::kernels::cuda {

void LaunchAdjustLogits(const AdjustLogitsParams& p, cudaStream_t stream) {
  if (p.num_adjustments == 0) return;
  LaunchKernel(logits::AdjustLogitsKernel, static_cast<unsigned>(p.num_adjustments),
               logits::kThreads, 0, stream, p);
}

}  // namespace kvserve::kernels::cuda
