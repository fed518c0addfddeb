// Collectives between the ranks of one tensor-parallel group: Gloo over loopback TCP for the
// CPU backend (kernels/cpu/gloo_communicator.h) and NCCL for CUDA
// (kernels/cuda/nccl_communicator.h). Buffers are float32 in the backend's memory (host for
// Gloo, device for NCCL). Every call takes a timeout from the group's creation; a rank that
// errors or stalls makes its peers' calls fail with DeadlineExceeded/Internal instead of
// hanging.
//
//   ASSIGN_OR_RETURN(auto comms, CreateGlooGroup(2, absl::Seconds(30)));  // one per rank
//   RETURN_IF_ERROR(comms[rank]->AllReduceSum(partial.data(), partial.size()));
//
// Each Communicator is used by its rank's thread only (NCCL's watchdog thread aside).
#ifndef KVSERVE_KERNELS_COMMUNICATOR_H_
#define KVSERVE_KERNELS_COMMUNICATOR_H_

#include <cstddef>
#include <string_view>

#include "absl/status/status.h"

namespace kvserve::kernels {

class Communicator {
 public:
  virtual ~Communicator() = default;
  [[nodiscard]] virtual int rank() const = 0;
  [[nodiscard]] virtual int size() const = 0;
  [[nodiscard]] virtual std::string_view name() const = 0;

  // data[i] = Σ over ranks of data[i], in place.
  virtual absl::Status AllReduceSum(float* data, size_t count) = 0;
  // out = concatenation over ranks (rank order) of each rank's `count` floats.
  virtual absl::Status AllGather(const float* in, size_t count, float* out) = 0;
  // data = root's data.
  virtual absl::Status Broadcast(float* data, size_t count, int root) = 0;
  virtual absl::Status Barrier() = 0;

  // Whether the Enqueue calls work: the communicator can order a collective on the backend's
  // own stream (NCCL), so a tensor-parallel step needs no host round trip.
  [[nodiscard]] virtual bool stream_ordered() const { return false; }
  // AllReduceSum / AllGather as a step of `stream` (Backend::OpStream): after the work queued
  // there, before what is queued later; they return once enqueued, with no wait on the host.
  // A collective that fails or stalls past the timeout is aborted by a watchdog, and every
  // later call returns that error. Called while the stream records a graph (Backend::BeginGraph,
  // on this rank's thread), they are recorded, not run, and the watchdog has nothing to watch
  // until the graph replays: see EnqueueWatch.
  virtual absl::Status EnqueueAllReduceSum(float* data, size_t count, void* stream) {
    return absl::UnimplementedError("stream-ordered collectives need a GPU communicator (NCCL)");
  }
  virtual absl::Status EnqueueAllGather(const float* in, size_t count, float* out, void* stream) {
    return absl::UnimplementedError("stream-ordered collectives need a GPU communicator (NCCL)");
  }
  // OK, or the error that aborted the communicator (its watchdog's, or NCCL's asynchronous
  // one): the collectives that ran since the last check may have left garbage.
  virtual absl::Status status() { return absl::OkStatus(); }
  // Hands the watchdog the work queued on `stream` so far, as if it were one more collective:
  // called after a graph replay, it bounds the collectives recorded in the graph by the timeout.
  virtual absl::Status EnqueueWatch(void* stream) {
    return absl::UnimplementedError("stream-ordered collectives need a GPU communicator (NCCL)");
  }
};

}  // namespace kvserve::kernels

#endif  // KVSERVE_KERNELS_COMMUNICATOR_H_
