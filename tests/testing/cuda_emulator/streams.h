// Streams of the emulated CUDA runtime (runtime.cc): work is queued on its stream and runs as
// late as the program allows, when something waits for it (a stream or event synchronize, a
// stream waiting on an event whose work is still queued, a copy to pageable host memory, a
// cudaFree). Host code that reads results, reuses a buffer or lets one stream use another's
// output without the synchronisation CUDA requires then sees stale data in the tests, as it
// could on a GPU.
#ifndef KVSERVE_TESTS_TESTING_CUDA_EMULATOR_STREAMS_H_
#define KVSERVE_TESTS_TESTING_CUDA_EMULATOR_STREAMS_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>

namespace kvserve::emulation {

// Queues `work` on `stream` (null: the current device's legacy stream).
void Enqueue(cudaStream_t stream, std::function<void()> work);

// Kernel launches and cuBLAS GEMM calls made so far, on every device: a test counts an engine
// step's by the difference. LaunchKernel and the emulated cuBLAS call CountLaunch.
void CountLaunch();
int64_t LaunchCount();

// Host waits for the device made so far, on every thread: each call that returns only once
// queued device work is done (a stream, device or event synchronize whose event has not
// passed, cudaMemcpy, cudaMemset, a copy to pageable memory, cudaFree, cudaFreeHost). A
// cudaStreamQuery does not count (it does not wait on a GPU). A test counts a step's by the
// difference.
void CountSync();
int64_t SyncCount();

// Work items queued on any stream and not run yet: what a GPU would still be running when the
// host moves on (async scheduling leaves the next step queued).
int64_t QueuedWork();

// The most shared memory a block may opt in to (cudaFuncAttributeMaxDynamicSharedMemorySize)
// on the emulated device, as on sm_90: 227 KiB.
inline constexpr size_t kMaxOptInSharedBytes = size_t{227} << 10;

// The shared memory a block of `kernel` may take: 48 KiB, or what cudaFuncSetAttribute's
// cudaFuncAttributeMaxDynamicSharedMemorySize opted it in to (LaunchKernel passes it on).
size_t KernelSharedLimit(const void* kernel);

}  // namespace kvserve::emulation

#endif  // KVSERVE_TESTS_TESTING_CUDA_EMULATOR_STREAMS_H_
