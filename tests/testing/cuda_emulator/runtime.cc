// The CUDA runtime calls of the CUDA backend, on the CPU, for the emulated build
// (KVSERVE_CUDA=EMULATED): kernels_cuda compiled by the host compiler runs its kernels on the
// emulator (emulator.h) and links these definitions (and cublas.cc, nccl.cc) instead of
// libcudart, libcublas and libnccl.
//
// The emulated machine has kDevices devices of KVSERVE_EMULATED_GPU_MIB MiB each (default
// 1024: every byte is poisoned, so an engine that fills its memory share writes it all; at
// 4096 that took CI minutes), 132 SMs and compute capability 9.0. Device and pinned memory are
// host memory, poisoned when allocated. Work on a stream (kernels, async copies and memsets,
// GEMMs, collectives, stream-ordered frees) is queued and runs as late as CUDA's rules allow
// (streams.h): when the host synchronizes a stream or an event, when a stream reaches a wait on
// an event of another, at copies to pageable host memory, which CUDA completes before
// returning, and at cudaFree / cudaFreeHost, which synchronize the device. Queries run the work
// and report it done. Copies from pageable host memory read it at the call, as CUDA stages them.
//
// Graphs: work issued to a stream between cudaStreamBeginCapture and cudaStreamEndCapture is
// recorded instead of queued (with the arguments of the call, as a GPU records kernel
// parameters), and cudaGraphLaunch queues it all again as one launch. What CUDA forbids while
// capturing aborts with a message here: waiting for the capturing stream, copies to or from
// pageable memory on it, allocating or freeing from the capturing thread, and events on it.
// An instantiated graph holds kGraphNodeBytes of device memory per recorded call until it is
// destroyed, and instantiating fails with cudaErrorMemoryAllocation when the device has not
// that much free: a stand-in for what a GPU's driver keeps per node (about 64 KiB per kernel
// node in a measurement on NVIDIA's forum, "Increasing memory footprint with large task
// graphs"), so that running out of memory while recording can be tested. The GPU run measures
// the real figure (the engine's graph recording line).
#include <cuda_runtime_api.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>  // std::recursive_mutex
#include <new>
#include <set>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "glog/logging.h"
#include "tests/testing/cuda_emulator/streams.h"

namespace {

constexpr int kDevices = 8;
constexpr std::align_val_t kAlign{256};
// New device and pinned memory holds this byte (NaN as float or bf16, -1 as an integer), not
// the zeros fresh host pages would: reads of memory nothing wrote show in the results.
constexpr int kPoison = 0xff;
// Past the end of each device and pinned allocation: this many bytes of poison, checked when
// the allocation is freed, so that a kernel or copy that wrote past a buffer's end aborts
// there (on a GPU it would corrupt whatever lies next, or fault) and reads past it see NaN.
constexpr size_t kGuardBytes = 256;
constexpr size_t kGraphNodeBytes = 64 << 10;
constexpr size_t kHugePage = size_t{2} << 20;

thread_local int current_device = 0;
thread_local cudaError_t last_error = cudaSuccess;

cudaError_t Fail(cudaError_t e) {
  last_error = e;
  return e;
}

// Device memory (accounted per device against its capacity) and pinned host memory.
class Memory {
 public:
  static Memory& Get() {
    static Memory memory;
    return memory;
  }

  cudaError_t AllocateDevice(void** p, size_t bytes, int device) {
    absl::MutexLock lock(&mu_);
    if (used_[device] + bytes > capacity_) return cudaErrorMemoryAllocation;
    *p = NewPoisoned(bytes);
    if (*p == nullptr) return cudaErrorMemoryAllocation;
    used_[device] += bytes;
    device_[*p] = {device, bytes};
    return cudaSuccess;
  }

  // Device memory that no pointer names (an instantiated graph's).
  cudaError_t Charge(int device, size_t bytes) {
    absl::MutexLock lock(&mu_);
    if (used_[device] + bytes > capacity_) return cudaErrorMemoryAllocation;
    used_[device] += bytes;
    return cudaSuccess;
  }
  void Release(int device, size_t bytes) {
    absl::MutexLock lock(&mu_);
    used_[device] -= bytes;
  }

  cudaError_t FreeDevice(void* p) {
    if (p == nullptr) return cudaSuccess;
    absl::MutexLock lock(&mu_);
    auto it = device_.find(p);
    if (it == device_.end()) return cudaErrorInvalidValue;
    used_[it->second.device] -= it->second.bytes;
    CheckGuard(p, it->second.bytes, "device");
    DeletePoisoned(p, it->second.bytes);
    device_.erase(it);
    return cudaSuccess;
  }

  cudaError_t AllocatePinned(void** p, size_t bytes) {
    *p = NewPoisoned(bytes);
    if (*p == nullptr) return cudaErrorMemoryAllocation;
    absl::MutexLock lock(&mu_);
    pinned_[*p] = {-1, bytes};
    return cudaSuccess;
  }

  cudaError_t FreePinned(void* p) {
    if (p == nullptr) return cudaSuccess;
    absl::MutexLock lock(&mu_);
    auto it = pinned_.find(p);
    if (it == pinned_.end()) return cudaErrorInvalidValue;
    CheckGuard(p, it->second.bytes, "pinned host");
    DeletePoisoned(p, it->second.bytes);
    pinned_.erase(it);
    return cudaSuccess;
  }

  // Neither device memory nor pinned host memory.
  bool Pageable(const void* p) {
    absl::MutexLock lock(&mu_);
    return !Within(device_, p) && !Within(pinned_, p);
  }

  void Info(int device, size_t* free, size_t* total) {
    absl::MutexLock lock(&mu_);
    *total = capacity_;
    *free = capacity_ - used_[device];
  }

 private:
  struct Allocation {
    int device;
    size_t bytes;
  };
  using Allocations = std::map<const void*, Allocation>;

  Memory() {
    const char* mib = std::getenv("KVSERVE_EMULATED_GPU_MIB");
    capacity_ = size_t{1048576} * (mib != nullptr ? std::strtoull(mib, nullptr, 10) : 1024);
  }

  // Allocations of kHugePage or more are mapped whole, 2 MiB aligned, with transparent huge
  // pages asked for: poisoning a GiB of fresh 4 KiB pages spent seconds in page faults.
  static bool Mapped(size_t bytes) { return bytes + kGuardBytes >= kHugePage; }
  static size_t MappedBytes(size_t bytes) {
    return (bytes + kGuardBytes + kHugePage - 1) / kHugePage * kHugePage;
  }

  static void* NewPoisoned(size_t bytes) {
    void* p = Mapped(bytes) ? MapAligned(MappedBytes(bytes))
                            : ::operator new(bytes + kGuardBytes, kAlign, std::nothrow);
    if (p != nullptr) std::memset(p, kPoison, bytes + kGuardBytes);
    return p;
  }
  static void DeletePoisoned(void* p, size_t bytes) {
    if (Mapped(bytes)) {
      PCHECK(munmap(p, MappedBytes(bytes)) == 0) << "munmap of emulated memory";
    } else {
      ::operator delete(p, kAlign);
    }
  }
  // `size` bytes (a multiple of kHugePage) at a kHugePage boundary, or null.
  static void* MapAligned(size_t size) {
    const size_t span = size + kHugePage;
    void* raw = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return nullptr;
    const auto start = reinterpret_cast<uintptr_t>(raw);
    const uintptr_t begin = (start + kHugePage - 1) & ~(kHugePage - 1), end = begin + size;
    if (begin > start) munmap(raw, begin - start);
    if (start + span > end) munmap(reinterpret_cast<void*>(end), start + span - end);
    void* p = reinterpret_cast<void*>(begin);
    madvise(p, size, MADV_HUGEPAGE);  // a request: where THP is off the pages stay small
    return p;
  }

  static void CheckGuard(const void* p, size_t bytes, const char* kind) {
    const auto* guard = static_cast<const unsigned char*>(p) + bytes;
    for (size_t i = 0; i < kGuardBytes; ++i) {
      CHECK_EQ(static_cast<int>(guard[i]), kPoison)
          << "emulated " << kind << " memory written past its end: byte " << i << " after the "
          << bytes << " bytes at " << p;
    }
  }

  static bool Within(const Allocations& m, const void* p) {
    auto it = m.upper_bound(p);
    if (it == m.begin()) return false;
    --it;
    return static_cast<const char*>(p) < static_cast<const char*>(it->first) + it->second.bytes;
  }

  size_t capacity_;  // constant after construction
  absl::Mutex mu_;
  size_t used_[kDevices] ABSL_GUARDED_BY(mu_) = {};
  Allocations device_ ABSL_GUARDED_BY(mu_);
  Allocations pinned_ ABSL_GUARDED_BY(mu_);
};

// A stream's queue: its work runs in order, on whichever host thread first waits for it.
struct Stream {
  explicit Stream(int d) : device(d) {}
  const int device;
  // Held while running queued work: recursive, since queued work may wait for its own stream
  // (absl::Mutex is not), hence no annotation on `done`.
  std::recursive_mutex running;
  uint64_t done = 0;  // under `running`
  absl::Mutex mu;
  std::deque<std::function<void()>> work ABSL_GUARDED_BY(mu);
  // While a graph is being captured on the stream: its recorded work.
  std::shared_ptr<std::vector<std::function<void()>>> capture ABSL_GUARDED_BY(mu);
  uint64_t enqueued ABSL_GUARDED_BY(mu) = 0;
};

// An event: the stream and the point in it (work items up to the record) it stands for, and
// the host time at which the stream passed that point (for cudaEventElapsedTime).
struct Event {
  Stream* stream = nullptr;
  uint64_t position = 0;
  std::shared_ptr<std::atomic<int64_t>> passed_ns;  // -1 until passed
};

class Streams {
 public:
  static Streams& Get() {
    static Streams streams;
    return streams;
  }

  Stream* Create() {
    auto* s = new Stream(current_device);
    absl::MutexLock lock(&mu_);
    live_.insert(s);
    return s;
  }

  void Destroy(Stream* s) {
    RunAll(s);
    absl::MutexLock lock(&mu_);
    live_.erase(s);
    delete s;
  }

  // The handle's stream: null and the legacy / per-thread handles are the device's legacy one.
  Stream* Of(cudaStream_t handle) {
    if (handle != nullptr && handle != cudaStreamLegacy && handle != cudaStreamPerThread) {
      return reinterpret_cast<Stream*>(handle);
    }
    absl::MutexLock lock(&mu_);
    std::unique_ptr<Stream>& s = legacy_[current_device];
    if (s == nullptr) {
      s = std::make_unique<Stream>(current_device);
      live_.insert(s.get());
    }
    return s.get();
  }

  void Enqueue(Stream* s, std::function<void()> work) {
    absl::MutexLock lock(&s->mu);
    if (s->capture != nullptr) {
      s->capture->push_back(std::move(work));
      return;
    }
    s->work.push_back(std::move(work));
    ++s->enqueued;
  }

  uint64_t Position(Stream* s) {
    absl::MutexLock lock(&s->mu);
    return s->enqueued;
  }

  static bool Capturing(Stream* s) {
    absl::MutexLock lock(&s->mu);
    return s->capture != nullptr;
  }

  // Runs the stream's work until `position` items are done. A `host_wait` (the host blocks
  // until then, as in a synchronize) that finds work to run is counted (SyncCount).
  void RunUpTo(Stream* s, uint64_t position, bool host_wait = false) {
    CHECK(!Capturing(s)) << "emulated CUDA: waiting for a stream that is capturing a graph "
                            "(cudaErrorStreamCaptureUnsupported on a GPU)";
    std::lock_guard<std::recursive_mutex> running(s->running);
    if (host_wait && s->done < position) kvserve::emulation::CountSync();
    while (s->done < position) {
      std::function<void()> next;
      {
        absl::MutexLock lock(&s->mu);
        next = std::move(s->work.front());
        s->work.pop_front();
      }
      next();
      ++s->done;
    }
  }

  void RunAll(Stream* s, bool host_wait = false) { RunUpTo(s, Position(s), host_wait); }

  // Work items queued and not yet run, on every stream.
  int64_t Queued() {
    std::vector<Stream*> streams;
    {
      absl::MutexLock lock(&mu_);
      streams.assign(live_.begin(), live_.end());
    }
    int64_t queued = 0;
    for (Stream* s : streams) {
      std::lock_guard<std::recursive_mutex> running(s->running);
      absl::MutexLock lock(&s->mu);
      queued += static_cast<int64_t>(s->work.size());
    }
    return queued;
  }

  // What cudaDeviceSynchronize waits for: every stream of the current device (a host wait).
  void SynchronizeDevice() {
    std::vector<Stream*> streams;
    {
      absl::MutexLock lock(&mu_);
      for (Stream* s : live_) {
        if (s->device == current_device) streams.push_back(s);
      }
    }
    for (Stream* s : streams) RunAll(s, /*host_wait=*/true);
  }

 private:
  absl::Mutex mu_;
  std::set<Stream*> live_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Stream> legacy_[kDevices] ABSL_GUARDED_BY(mu_);
};

Stream* StreamOf(cudaStream_t handle) { return Streams::Get().Of(handle); }

// Streams this thread is capturing on (cudaStreamCaptureModeThreadLocal): while any, the thread
// may not allocate or free memory.
thread_local int capturing_here = 0;

void NotCapturing(const char* call) {
  CHECK_EQ(capturing_here, 0) << "emulated CUDA: " << call
                              << " while this thread captures a graph "
                                 "(cudaErrorStreamCaptureUnsupported on a GPU)";
}

void NotCapturing(Stream* s, const char* call) {
  CHECK(!Streams::Capturing(s)) << "emulated CUDA: " << call
                                << " on a stream that is capturing a graph (not supported)";
}

}  // namespace

// A captured graph, and an instantiated one: the recorded work, in order.
struct CUgraph_st {
  std::shared_ptr<std::vector<std::function<void()>>> nodes;
};
struct CUgraphExec_st {
  std::shared_ptr<const std::vector<std::function<void()>>> nodes;
  int device;
  size_t bytes;  // the device memory it holds
};

namespace kvserve::emulation {

void Enqueue(cudaStream_t stream, std::function<void()> work) {
  Streams::Get().Enqueue(StreamOf(stream), std::move(work));
}

namespace {
std::atomic<int64_t> launches{0};
std::atomic<int64_t> syncs{0};
}  // namespace

void CountLaunch() { launches.fetch_add(1, std::memory_order_relaxed); }
int64_t LaunchCount() { return launches.load(std::memory_order_relaxed); }

void CountSync() { syncs.fetch_add(1, std::memory_order_relaxed); }
int64_t SyncCount() { return syncs.load(std::memory_order_relaxed); }

int64_t QueuedWork() { return Streams::Get().Queued(); }

}  // namespace kvserve::emulation

namespace {
std::mutex& SharedLimitsMutex() {
  static std::mutex m;
  return m;
}
std::map<const void*, size_t>& SharedLimits() {
  static std::map<const void*, size_t> limits;
  return limits;
}
}  // namespace

namespace kvserve::emulation {
size_t KernelSharedLimit(const void* kernel) {
  std::lock_guard lock(SharedLimitsMutex());
  const auto it = SharedLimits().find(kernel);
  return it == SharedLimits().end() ? size_t{48} << 10 : it->second;
}
}  // namespace kvserve::emulation

extern "C" {

cudaError_t cudaGetDeviceCount(int* count) {
  *count = kDevices;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= kDevices) return Fail(cudaErrorInvalidDevice);
  current_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  *device = current_device;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (device < 0 || device >= kDevices) return Fail(cudaErrorInvalidDevice);
  switch (attr) {
    case cudaDevAttrMultiProcessorCount:
      *value = 132;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor:
      *value = 9;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor:
      *value = 0;
      return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
      *value = static_cast<int>(kvserve::emulation::kMaxOptInSharedBytes);
      return cudaSuccess;
    default:
      return Fail(cudaErrorInvalidValue);
  }
}

// Shared memory opt-in (what the emulator's launches check) and occupancy. The emulated SM has
// sm_90's 228 KiB of shared memory (1 KiB of it reserved per block) and 2048 threads; it has no
// register file, so the occupancy ignores registers (ptxas reports them: tools/ptx_stats.sh).
cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return Fail(cudaErrorInvalidValue);
  if (value < 0 || static_cast<size_t>(value) > kvserve::emulation::kMaxOptInSharedBytes) {
    return Fail(cudaErrorInvalidValue);
  }
  std::lock_guard lock(SharedLimitsMutex());
  SharedLimits()[func] = static_cast<size_t>(value);
  return cudaSuccess;
}

cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, const void* func,
                                                          int block_size, size_t dynamic_bytes) {
  if (block_size <= 0 || block_size > 1024) return Fail(cudaErrorInvalidValue);
  if (dynamic_bytes > kvserve::emulation::KernelSharedLimit(func)) {
    *blocks = 0;
    return cudaSuccess;
  }
  constexpr size_t kSmBytes = size_t{228} << 10, kReservedPerBlock = size_t{1} << 10;
  *blocks = static_cast<int>(std::min<size_t>(
      {size_t{32}, size_t{2048} / block_size, kSmBytes / (dynamic_bytes + kReservedPerBlock)}));
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() {
  Streams::Get().SynchronizeDevice();
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  Memory::Get().Info(current_device, free, total);
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** p, size_t bytes) {
  NotCapturing("cudaMalloc");
  const cudaError_t e = Memory::Get().AllocateDevice(p, bytes, current_device);
  return e == cudaSuccess ? e : Fail(e);
}

cudaError_t cudaMallocAsync(void** p, size_t bytes, cudaStream_t stream) {
  NotCapturing(StreamOf(stream), "cudaMallocAsync");
  return cudaMalloc(p, bytes);
}

cudaError_t cudaFree(void* p) {
  NotCapturing("cudaFree");
  Streams::Get().SynchronizeDevice();
  const cudaError_t e = Memory::Get().FreeDevice(p);
  return e == cudaSuccess ? e : Fail(e);
}

cudaError_t cudaFreeAsync(void* p, cudaStream_t stream) {
  NotCapturing(StreamOf(stream), "cudaFreeAsync");
  kvserve::emulation::Enqueue(
      stream, [p] { CHECK_EQ(Memory::Get().FreeDevice(p), cudaSuccess) << "cudaFreeAsync"; });
  return cudaSuccess;
}

cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned int) {
  NotCapturing("cudaHostAlloc");
  const cudaError_t e = Memory::Get().AllocatePinned(p, bytes);
  return e == cudaSuccess ? e : Fail(e);
}

cudaError_t cudaMallocHost(void** p, size_t bytes) { return cudaHostAlloc(p, bytes, 0); }

cudaError_t cudaFreeHost(void* p) {
  NotCapturing("cudaFreeHost");
  Streams::Get().SynchronizeDevice();
  const cudaError_t e = Memory::Get().FreePinned(p);
  return e == cudaSuccess ? e : Fail(e);
}

cudaError_t cudaHostGetDevicePointer(void** device, void* host, unsigned int) {
  *device = host;  // mapped pinned memory: the same address on both sides
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind,
                            cudaStream_t stream) {
  if (bytes == 0) return cudaSuccess;
  Memory& memory = Memory::Get();
  Stream* s = StreamOf(stream);
  if (Streams::Capturing(s)) {
    CHECK(!memory.Pageable(src) && !memory.Pageable(dst))
        << "emulated CUDA: a copy to or from pageable memory on a stream that is capturing a "
           "graph (cudaErrorStreamCaptureUnsupported on a GPU)";
  }
  if (memory.Pageable(src)) {  // staged at the call: the source may change right after
    auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src),
                                                      static_cast<const char*>(src) + bytes);
    Streams::Get().Enqueue(s, [dst, staged] { std::memcpy(dst, staged->data(), staged->size()); });
  } else {
    Streams::Get().Enqueue(s, [dst, src, bytes] { std::memmove(dst, src, bytes); });
  }
  if (memory.Pageable(dst)) Streams::Get().RunAll(s, /*host_wait=*/true);  // once it is done
  return cudaSuccess;
}

// On the legacy stream, which the backend's non-blocking streams do not wait for or make wait.
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  cudaMemcpyAsync(dst, src, bytes, kind, nullptr);
  Streams::Get().RunAll(StreamOf(nullptr), /*host_wait=*/true);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t stream) {
  kvserve::emulation::Enqueue(stream, [p, value, bytes] { std::memset(p, value, bytes); });
  return cudaSuccess;
}

cudaError_t cudaMemset(void* p, int value, size_t bytes) {
  cudaMemsetAsync(p, value, bytes, nullptr);
  Streams::Get().RunAll(StreamOf(nullptr), /*host_wait=*/true);
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* s) {
  *s = reinterpret_cast<cudaStream_t>(Streams::Get().Create());
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int) { return cudaStreamCreate(s); }

cudaError_t cudaStreamDestroy(cudaStream_t s) {
  Streams::Get().Destroy(reinterpret_cast<Stream*>(s));
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  Streams::Get().RunAll(StreamOf(s), /*host_wait=*/true);
  return cudaSuccess;
}

// Runs the stream (the emulated device runs only when waited for), yet not a host wait: a GPU
// answers at once.
cudaError_t cudaStreamQuery(cudaStream_t s) {
  Streams::Get().RunAll(StreamOf(s));
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int) {
  *e = reinterpret_cast<cudaEvent_t>(new Event);
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, 0); }

cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete reinterpret_cast<Event*>(e);
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t stream) {
  Stream* s = StreamOf(stream);
  NotCapturing(s, "cudaEventRecord");
  auto passed = std::make_shared<std::atomic<int64_t>>(-1);
  Streams::Get().Enqueue(s, [passed] {
    *passed = std::chrono::duration_cast<std::chrono::nanoseconds>(
                  std::chrono::steady_clock::now().time_since_epoch())
                  .count();
  });
  *reinterpret_cast<Event*>(e) = {s, Streams::Get().Position(s), std::move(passed)};
  return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  const Event& a = *reinterpret_cast<Event*>(start);
  const Event& b = *reinterpret_cast<Event*>(end);
  if (a.passed_ns == nullptr || b.passed_ns == nullptr) return Fail(cudaErrorInvalidResourceHandle);
  if (*a.passed_ns < 0 || *b.passed_ns < 0) return Fail(cudaErrorNotReady);
  *ms = static_cast<float>(static_cast<double>(*b.passed_ns - *a.passed_ns) / 1e6);
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  const Event ev = *reinterpret_cast<Event*>(e);
  if (ev.stream != nullptr) Streams::Get().RunUpTo(ev.stream, ev.position, /*host_wait=*/true);
  return cudaSuccess;
}

// Does not run the stream: the event is reached only when something waits for it (as a GPU
// that has not got there yet).
cudaError_t cudaEventQuery(cudaEvent_t e) {
  const Event ev = *reinterpret_cast<Event*>(e);
  return ev.passed_ns != nullptr && *ev.passed_ns < 0 ? cudaErrorNotReady : cudaSuccess;
}

// Waits for the event as recorded now: a later record does not move it.
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t e, unsigned int) {
  NotCapturing(StreamOf(stream), "cudaStreamWaitEvent");
  const Event ev = *reinterpret_cast<Event*>(e);
  if (ev.stream != nullptr) {
    kvserve::emulation::Enqueue(stream, [ev] { Streams::Get().RunUpTo(ev.stream, ev.position); });
  }
  return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
  CHECK(mode == cudaStreamCaptureModeThreadLocal)
      << "emulated CUDA: only thread-local capture is emulated";
  Stream* s = StreamOf(stream);
  if (stream == nullptr || stream == cudaStreamLegacy) return Fail(cudaErrorStreamCaptureImplicit);
  {
    absl::MutexLock lock(&s->mu);
    if (s->capture != nullptr) return Fail(cudaErrorIllegalState);
    s->capture = std::make_shared<std::vector<std::function<void()>>>();
  }
  ++capturing_here;
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  Stream* s = StreamOf(stream);
  absl::MutexLock lock(&s->mu);
  if (s->capture == nullptr) return Fail(cudaErrorIllegalState);
  *graph = new CUgraph_st{std::move(s->capture)};
  s->capture = nullptr;
  --capturing_here;
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  *status = Streams::Capturing(StreamOf(stream)) ? cudaStreamCaptureStatusActive
                                                 : cudaStreamCaptureStatusNone;
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  const size_t bytes = kGraphNodeBytes * graph->nodes->size();
  if (const cudaError_t e = Memory::Get().Charge(current_device, bytes); e != cudaSuccess) {
    return Fail(e);
  }
  *exec = new CUgraphExec_st{graph->nodes, current_device, bytes};
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete graph;
  return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  Memory::Get().Release(exec->device, exec->bytes);
  delete exec;  // a launch still queued holds the work
  return cudaSuccess;
}

// One launch (one count of emulation::LaunchCount) that runs the recorded work in order.
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  NotCapturing(StreamOf(stream), "cudaGraphLaunch");
  kvserve::emulation::CountLaunch();
  kvserve::emulation::Enqueue(stream, [nodes = exec->nodes] {
    for (const std::function<void()>& node : *nodes) node();
  });
  return cudaSuccess;
}

cudaError_t cudaGetLastError() {
  const cudaError_t e = last_error;
  last_error = cudaSuccess;
  return e;
}

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "no error";
    case cudaErrorMemoryAllocation:
      return "out of memory (emulated device)";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal (emulated device)";
    case cudaErrorInvalidValue:
      return "invalid argument (emulated device)";
    default:
      return "unknown error (emulated device)";
  }
}

}  // extern "C"
