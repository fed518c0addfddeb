// Error checks for CUDA runtime and cuBLAS calls in the CUDA backend. A failing call is a
// programming error or a lost device: the worker cannot go on, so the check aborts with the
// call, the error text and the place (the worker's supervisor restarts it).
#ifndef KVSERVE_KERNELS_CUDA_DEVICE_CUDA_CHECK_H_
#define KVSERVE_KERNELS_CUDA_DEVICE_CUDA_CHECK_H_

#include <cuda_runtime_api.h>

#include "glog/logging.h"

#define KVSERVE_CUDA_CHECK(call)                                  \
  do {                                                            \
    const cudaError_t kvserve_cuda_err = (call);                  \
    CHECK_EQ(kvserve_cuda_err, cudaSuccess)                       \
        << #call << ": " << cudaGetErrorString(kvserve_cuda_err); \
  } while (0)

// After a kernel launch: catches bad launch configurations at the launch site.
#define KVSERVE_CUDA_CHECK_LAUNCH() KVSERVE_CUDA_CHECK(cudaGetLastError())

#endif  // KVSERVE_KERNELS_CUDA_DEVICE_CUDA_CHECK_H_
