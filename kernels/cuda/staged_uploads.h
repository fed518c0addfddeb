// Host-to-device uploads that return at once: the bytes are copied into one of a ring of pinned
// buffers and the device copies them from there in stream order, so that an engine step's
// uploads (the packed batch, the logits adjustments, a constrained row's mask) never make the
// host wait for the device (the CUDA backend's Upload; docs/PERF.md, "The engine's host path").
// A buffer is reused once the copy that read it is done (an event, passed long before in
// steady state: eight uploads later, two steps or more, and async scheduling has waited for
// the step before the one in flight).
//
//   StagedUploads uploads;
//   absl::Status s = uploads.Init();
//   uploads.Upload(device_dst, host_src, bytes, stream);  // src may be reused at once
//
// Used by one thread at a time (the backend's owner). Not while a stream captures a graph.
#ifndef KVSERVE_KERNELS_CUDA_STAGED_UPLOADS_H_
#define KVSERVE_KERNELS_CUDA_STAGED_UPLOADS_H_

#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>

namespace kvserve::kernels::cuda {

class StagedUploads {
 public:
  // Uploads larger than this (weights at load) copy straight from the source and wait.
  static constexpr size_t kMaxStagedBytes = size_t{4} << 20;

  StagedUploads() = default;
  StagedUploads(const StagedUploads&) = delete;
  StagedUploads& operator=(const StagedUploads&) = delete;
  ~StagedUploads() { Release(); }
  // Waits for the copies in flight, then frees the buffers and events (idempotent): before the
  // streams they were queued on are destroyed.
  void Release();

  // Creates the ring's events; a CUDA error aborts (cuda_check.h).
  void Init();
  // Queues the copy of `bytes` from `src` (host) to `dst` (device) on `stream`, after the work
  // queued there before; `src` may be reused when it returns.
  void Upload(void* dst, const void* src, size_t bytes, cudaStream_t stream);

 private:
  struct Buffer {
    void* data = nullptr;  // pinned host memory
    size_t capacity = 0;
    cudaEvent_t done = nullptr;  // recorded after the copy that read it
  };
  std::array<Buffer, 8> ring_;
  size_t next_ = 0;
};

}  // namespace kvserve::kernels::cuda

#endif  // KVSERVE_KERNELS_CUDA_STAGED_UPLOADS_H_
