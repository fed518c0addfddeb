// float32 to and from the 16-bit types a kernel reads or writes (fp16, bf16), and float32 itself,
// so that a kernel templated on its element type converts with one name. Device code; the
// emulator (tests/testing/cuda_emulator/emulator.h) runs it too.
#ifndef KVSERVE_KERNELS_CUDA_DEVICE_FLOAT16_CUH_
#define KVSERVE_KERNELS_CUDA_DEVICE_FLOAT16_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

namespace kvserve::kernels::cuda {

__device__ inline float Widen(float x) { return x; }
__device__ inline float Widen(__half x) { return __half2float(x); }
__device__ inline float Widen(__nv_bfloat16 x) { return __bfloat162float(x); }

// float32 as the output type, rounded to nearest even for the 16-bit ones.
template <typename Out>
__device__ inline Out Narrow(float x) {
  if constexpr (std::is_same_v<Out, __half>) {
    return __float2half_rn(x);
  } else if constexpr (std::is_same_v<Out, __nv_bfloat16>) {
    return __float2bfloat16_rn(x);
  } else {
    return x;
  }
}

}  // namespace kvserve::kernels::cuda

#endif  // KVSERVE_KERNELS_CUDA_DEVICE_FLOAT16_CUH_
