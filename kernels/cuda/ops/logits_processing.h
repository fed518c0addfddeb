// Launcher of the logits adjustments on the GPU (kernels/logits_processing.h's rule, the same
// logits as the CPU twin kernels/cpu/logits_processing.h). Pointers in `p` are device
// pointers; asynchronous on `stream`.
#ifndef KVSERVE_KERNELS_CUDA_OPS_LOGITS_PROCESSING_H_
#define KVSERVE_KERNELS_CUDA_OPS_LOGITS_PROCESSING_H_

#include <cuda_runtime_api.h>

#include "kernels/logits_processing.h"

namespace kvserve::kernels::cuda {

void LaunchAdjustLogits(const AdjustLogitsParams& p, cudaStream_t stream);

}  // namespace kvserve::kernels::cuda

#endif  // KVSERVE_KERNELS_CUDA_OPS_LOGITS_PROCESSING_H_
