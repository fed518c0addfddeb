// How kernels declare shared memory: through these macros, so that the CPU emulation
// (tests/testing/cuda_emulator/emulator.h, which refuses a bare __shared__) can give a block
// shared memory as a GPU does: holding garbage (NaN bytes) when the block starts, never the
// values a previous block left.
//
//   KVSERVE_SHARED(float[kWarps][kRows], red_m);  // __shared__ float red_m[kWarps][kRows];
//   KVSERVE_DYNAMIC_SHARED(float, red);           // extern __shared__ float red[];
#ifndef KVSERVE_KERNELS_CUDA_DEVICE_SHARED_MEMORY_CUH_
#define KVSERVE_KERNELS_CUDA_DEVICE_SHARED_MEMORY_CUH_

namespace kvserve::kernels::cuda {

// Names an array type where declarator syntax would put the bounds after the name.
template <typename T>
using SharedType = T;

}  // namespace kvserve::kernels::cuda

#if defined(KVSERVE_CUDA_EMULATION)
#define KVSERVE_SHARED(T, name)                                                       \
  static ::kvserve::emulation::GuardedShared<::kvserve::kernels::cuda::SharedType<T>> \
      name##_guarded;                                                                 \
  auto& name = ::kvserve::emulation::StaticShared(name##_guarded, #name)
#define KVSERVE_DYNAMIC_SHARED(T, name) T* name = ::kvserve::emulation::DynamicShared<T>()
#else
#define KVSERVE_SHARED(T, name) __shared__ ::kvserve::kernels::cuda::SharedType<T> name
#define KVSERVE_DYNAMIC_SHARED(T, name) extern __shared__ T name[]
#endif

#endif  // KVSERVE_KERNELS_CUDA_DEVICE_SHARED_MEMORY_CUH_
