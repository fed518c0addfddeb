// The launchers' one way to start a kernel: the triple-chevron launch, checked at the launch
// site; or, when the kernels are built by the host compiler for the CPU emulation
// (tests/testing/cuda_emulator/emulator.h defines KVSERVE_CUDA_EMULATION), a run on the emulator,
// queued on the stream (emulation/streams.h).
#ifndef KVSERVE_KERNELS_CUDA_DEVICE_LAUNCH_CUH_
#define KVSERVE_KERNELS_CUDA_DEVICE_LAUNCH_CUH_

#include <cuda_runtime_api.h>

#include <cstddef>

#include "kernels/cuda/device/cuda_check.h"
#ifdef KVSERVE_CUDA_EMULATION
#include "tests/testing/cuda_emulator/streams.h"
#endif

namespace kvserve::kernels::cuda {

// kernel<<<grid, threads, shared_bytes, stream>>>(args...); aborts on a bad launch.
template <typename... Params, typename... Args>
void LaunchKernel(void (*kernel)(Params...), dim3 grid, int threads, size_t shared_bytes,
                  cudaStream_t stream, const Args&... args) {
#ifdef KVSERVE_CUDA_EMULATION
  ::kvserve::emulation::CountLaunch();
  ::kvserve::emulation::Enqueue(stream, [=] {
    ::kvserve::emulation::Launch(
        {static_cast<int>(grid.x), static_cast<int>(grid.y), static_cast<int>(grid.z)}, threads,
        shared_bytes, [&] { kernel(args...); },
        ::kvserve::emulation::KernelSharedLimit(reinterpret_cast<const void*>(kernel)));
  });
#else
  // clang-format would split the chevrons.
  // clang-format off
  kernel<<<grid, threads, shared_bytes, stream>>>(args...);
  // clang-format on
#endif
  KVSERVE_CUDA_CHECK_LAUNCH();
}

}  // namespace kvserve::kernels::cuda

#endif  // KVSERVE_KERNELS_CUDA_DEVICE_LAUNCH_CUH_
