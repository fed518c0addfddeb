// Launcher of the fingerprint kernel (kernels/fingerprint.h) over device memory.
#ifndef KVSERVE_KERNELS_CUDA_OPS_FINGERPRINT_H_
#define KVSERVE_KERNELS_CUDA_OPS_FINGERPRINT_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace kvserve::kernels::cuda {

// Adds the terms of `bytes` bytes at `data` (device memory, any alignment) to `*sum` (device
// memory), on `stream`; the caller adds FingerprintLength(bytes) and starts *sum at 0.
void LaunchFingerprintTerms(const void* data, size_t bytes, unsigned long long* sum,
                            cudaStream_t stream);

}  // namespace kvserve::kernels::cuda

#endif  // KVSERVE_KERNELS_CUDA_OPS_FINGERPRINT_H_
