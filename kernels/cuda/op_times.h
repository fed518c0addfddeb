// Device time per op: CUDA events recorded around each op a backend issues on its stream, read
// back when the caller asks (Backend::TakeOpTimes), so that a step's time can be split by kernel
// without a profiler (the GPU run's per-kernel breakdown; docs/PERF.md). Off by default: two
// event records per op when on.
//
//   OpTimes times;
//   times.Enable(true);
//   { const OpTimes::Scope s(times, "gemm", stream); LaunchGemm(...); }
//   std::map<std::string, Backend::OpTime> by_op = times.Take();  // waits for the ops
//
// Used by one thread at a time (the backend's owner). Not while the stream captures a graph.
#ifndef KVSERVE_KERNELS_CUDA_OP_TIMES_H_
#define KVSERVE_KERNELS_CUDA_OP_TIMES_H_

#include <cuda_runtime_api.h>

#include <map>
#include <string>
#include <vector>

#include "kernels/backend.h"

namespace kvserve::kernels::cuda {

class OpTimes {
 public:
  OpTimes() = default;
  OpTimes(const OpTimes&) = delete;
  OpTimes& operator=(const OpTimes&) = delete;
  ~OpTimes() { Release(); }

  void Enable(bool on) { on_ = on; }
  [[nodiscard]] bool on() const { return on_; }
  // Waits for the ops timed so far and returns their times by op name (milliseconds, calls),
  // clearing them.
  std::map<std::string, Backend::OpTime> Take();
  // Destroys the events (idempotent): before the stream they were recorded on goes.
  void Release();

  // Times the ops issued on `stream` during its life under `op` (nothing when off or when
  // `capturing`: a graph being recorded).
  class Scope {
   public:
    Scope(OpTimes& t, const char* op, cudaStream_t stream, bool capturing);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    OpTimes* times_ = nullptr;  // null: not timed
    cudaStream_t stream_ = nullptr;
    size_t span_ = 0;  // its entry in spans_
  };

 private:
  struct Span {
    const char* op;
    cudaEvent_t begin, end;
  };
  cudaEvent_t NewEvent();

  bool on_ = false;
  std::vector<Span> spans_;         // recorded, not read yet
  std::vector<cudaEvent_t> spare_;  // read, for reuse
};

}  // namespace kvserve::kernels::cuda

#endif  // KVSERVE_KERNELS_CUDA_OP_TIMES_H_
