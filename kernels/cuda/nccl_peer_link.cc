#include "kernels/cuda/nccl_peer_link.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <deque>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "kernels/cuda/nccl_communicator.h"

namespace kvserve::kernels {
namespace {

bool Failed(ncclResult_t r) { return r != ncclSuccess && r != ncclInProgress; }

// A stream synchronize run by a helper thread, so that the caller can watch the clock (and
// abort the communicator, which ends the NCCL kernels the synchronize waits for).
class StreamWait {
 public:
  StreamWait(cudaStream_t stream, int device)
      : thread_([this, stream, device] {
          cudaSetDevice(device);
          const cudaError_t e = cudaStreamSynchronize(stream);
          absl::MutexLock lock(&mu_);
          error_ = e;
          done_ = true;
        }) {}
  ~StreamWait() { thread_.join(); }

  // True once the stream is done (error() says how), false after `wait` without.
  bool DoneWithin(absl::Duration wait) {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(&done_), wait);
  }
  cudaError_t error() {
    absl::MutexLock lock(&mu_);
    return error_;
  }

 private:
  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  cudaError_t error_ ABSL_GUARDED_BY(mu_) = cudaSuccess;
  std::thread thread_;  // last: starts once the rest is made
};

class NcclPeerLink final : public PeerLink {
 public:
  NcclPeerLink(ncclComm_t comm, cudaStream_t stream, int device, int rank, absl::Duration timeout)
      : comm_(comm), stream_(stream), device_(device), rank_(rank), timeout_(timeout) {}

  ~NcclPeerLink() override {
    cudaSetDevice(device_);
    if (!in_flight_.empty() && comm_ != nullptr) {  // a transfer the peer never took part in:
      ncclCommAbort(comm_);                         // end its kernels
      comm_ = nullptr;
    }
    in_flight_.clear();
    if (comm_ != nullptr) ncclCommDestroy(comm_);
    cudaStreamDestroy(stream_);
  }

  std::string_view name() const override { return "nccl"; }

  absl::Status Send(absl::Span<const ByteRange> ranges) override {
    RETURN_IF_ERROR(StartSend(ranges, nullptr));
    return Wait(kSend);
  }
  absl::Status Receive(absl::Span<const ByteRange> ranges) override {
    RETURN_IF_ERROR(StartReceive(ranges));
    return Wait(kReceive);
  }

  using PeerLink::StartSend;
  absl::Status StartSend(absl::Span<const ByteRange> ranges, Backend* after) override {
    RETURN_IF_ERROR(Idle(kReceive));
    const absl::Time deadline = absl::Now() + timeout_;
    if (after != nullptr) RETURN_IF_ERROR(Follow(*after));
    RETURN_IF_ERROR(Enqueue("send", ranges, deadline, [&](const ByteRange& r) {
      return ncclSend(r.data, r.bytes, ncclUint8, 1 - rank_, comm_, stream_);
    }));
    in_flight_.push_back({std::make_unique<StreamWait>(stream_, device_), deadline});
    direction_ = kSend;
    return absl::OkStatus();
  }
  absl::StatusOr<bool> PollSend() override { return Poll(kSend, absl::ZeroDuration()); }

  absl::Status StartReceive(absl::Span<const ByteRange> ranges) override {
    RETURN_IF_ERROR(Idle(kSend));
    const absl::Time deadline = absl::Now() + timeout_;
    RETURN_IF_ERROR(Enqueue("receive", ranges, deadline, [&](const ByteRange& r) {
      return ncclRecv(const_cast<void*>(r.data), r.bytes, ncclUint8, 1 - rank_, comm_, stream_);
    }));
    in_flight_.push_back({std::make_unique<StreamWait>(stream_, device_), deadline});
    direction_ = kReceive;
    return absl::OkStatus();
  }
  absl::StatusOr<bool> PollReceive() override { return Poll(kReceive, absl::ZeroDuration()); }

 private:
  enum Direction { kSend, kReceive };
  struct InFlight {
    std::unique_ptr<StreamWait> wait;  // the link's stream as it was once this op was queued
    absl::Time deadline;
  };

  // The link's failure, or FailedPrecondition while ops of direction `busy` are in flight.
  absl::Status Idle(Direction busy) {
    if (!failure_.ok()) return failure_;
    if (!in_flight_.empty() && direction_ == busy) {
      return absl::FailedPreconditionError(busy == kSend
                                               ? "a receive while a send is in flight on the link"
                                               : "a send while a receive is in flight on the link");
    }
    return absl::OkStatus();
  }

  // Makes the link's stream wait for the ops queued on `after` so far.
  absl::Status Follow(Backend& after) {
    cudaSetDevice(device_);
    cudaEvent_t done = nullptr;
    cudaError_t e = cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventRecord(done, static_cast<cudaStream_t>(after.OpStream()));
    if (e == cudaSuccess) e = cudaStreamWaitEvent(stream_, done, 0);
    if (done != nullptr) cudaEventDestroy(done);  // released once the wait is done with it
    if (e != cudaSuccess) {
      return Abort(absl::InternalError(
          absl::StrCat("nccl send after the backend's ops: ", cudaGetErrorString(e))));
    }
    return absl::OkStatus();
  }

  // Whether every op of `direction` in flight is done, waiting up to `wait_for` for the
  // oldest: the earliest error of Check, which ends the link.
  absl::StatusOr<bool> Poll(Direction direction, absl::Duration wait_for) {
    if (!failure_.ok()) return failure_;
    if (direction_ != direction) return true;
    while (!in_flight_.empty()) {
      InFlight& f = in_flight_.front();
      absl::StatusOr<bool> done =
          Check(direction == kSend ? "send" : "receive", *f.wait, f.deadline, wait_for);
      if (!done.ok() || !*done) return done;
      in_flight_.pop_front();
    }
    return true;
  }

  absl::Status Wait(Direction direction) {
    while (true) {
      absl::StatusOr<bool> done = Poll(direction, absl::Milliseconds(1));
      if (!done.ok() || *done) return done.status();
    }
  }

  // Whether the ops `wait` watches are done (after waiting up to `wait_for`): an error, the
  // link aborted, when they failed, NCCL reports the peer gone, or `deadline` passed.
  absl::StatusOr<bool> Check(const char* what, StreamWait& wait, absl::Time deadline,
                             absl::Duration wait_for) {
    // Done is read before NCCL's error: ops that ended because the peer went away have set
    // that error by the time they are done, so it is seen.
    const bool done = wait.DoneWithin(wait_for);
    if (const cudaError_t e = done ? wait.error() : cudaSuccess; e != cudaSuccess) {
      return Abort(absl::InternalError(absl::StrCat("nccl ", what, ": ", cudaGetErrorString(e))));
    }
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(comm_, &async);
    if (Failed(async)) {
      return Abort(absl::UnavailableError(
          absl::StrCat("nccl ", what, ": the peer is gone (", ncclGetErrorString(async), ")")));
    }
    if (done) return true;
    if (absl::Now() > deadline) {
      return Abort(absl::DeadlineExceededError(
          absl::StrCat("nccl ", what, " timed out after ", absl::FormatDuration(timeout_))));
    }
    return false;
  }

  // Queues one op per range in one NCCL group on the link's stream, and waits (until
  // `deadline`) for a non-blocking communicator to have put them on the stream.
  template <typename Op>
  absl::Status Enqueue(const char* what, absl::Span<const ByteRange> ranges, absl::Time deadline,
                       Op op) {
    if (!failure_.ok()) return failure_;
    cudaSetDevice(device_);
    ncclGroupStart();
    ncclResult_t queued = ncclSuccess;
    for (const ByteRange& r : ranges) {
      if (r.bytes > 0 && !Failed(queued)) queued = op(r);
    }
    const ncclResult_t grouped = ncclGroupEnd();
    if (Failed(queued) || Failed(grouped)) {
      return Abort(absl::InternalError(absl::StrCat(
          "nccl ", what, ": ", ncclGetErrorString(Failed(queued) ? queued : grouped))));
    }
    // A non-blocking communicator may still be queueing the group's kernels when ncclGroupEnd
    // returns ncclInProgress: the stream holds them only once the state leaves it.
    ncclResult_t state = grouped;
    while (state == ncclInProgress) {
      if (absl::Now() > deadline) {
        return Abort(absl::DeadlineExceededError(absl::StrCat(
            "nccl ", what, " was not queued within ", absl::FormatDuration(timeout_))));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      ncclCommGetAsyncError(comm_, &state);
    }
    if (Failed(state)) {
      return Abort(
          absl::UnavailableError(absl::StrCat("nccl ", what, ": ", ncclGetErrorString(state))));
    }
    return absl::OkStatus();
  }

  // Ends the communicator (and the kernels still waiting on the peer); every later call
  // returns `status`.
  absl::Status Abort(absl::Status status) {
    failure_ = status;
    if (comm_ != nullptr) ncclCommAbort(comm_);
    comm_ = nullptr;
    in_flight_.clear();  // their synchronizes return once the abort ended the kernels
    return status;
  }

  ncclComm_t comm_;  // null once aborted
  const cudaStream_t stream_;
  const int device_, rank_;
  const absl::Duration timeout_;
  absl::Status failure_;
  std::deque<InFlight> in_flight_;  // oldest first, all of direction_
  Direction direction_ = kSend;
};

}  // namespace

absl::StatusOr<std::string> NewNcclPeerId() {
  if (CudaDeviceCount() == 0) return absl::UnavailableError("no CUDA device");
  ncclUniqueId id;
  if (const ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) {
    return absl::UnavailableError(absl::StrCat("ncclGetUniqueId: ", ncclGetErrorString(r)));
  }
  return std::string(id.internal, sizeof(id.internal));
}

absl::StatusOr<std::unique_ptr<PeerLink>> JoinNcclPeerLink(std::string_view id, int rank,
                                                           int device, absl::Duration timeout) {
  ncclUniqueId uid;
  if (id.size() != sizeof(uid.internal)) {
    return absl::InvalidArgumentError(
        absl::StrCat("an NCCL link id has ", sizeof(uid.internal), " bytes, not ", id.size()));
  }
  if (rank != 0 && rank != 1) {
    return absl::InvalidArgumentError(absl::StrCat("a link's rank is 0 or 1, not ", rank));
  }
  if (CudaDeviceCount() == 0) return absl::UnavailableError("no CUDA device");
  std::memcpy(uid.internal, id.data(), id.size());
  if (const cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
    return absl::UnavailableError(
        absl::StrCat("cudaSetDevice(", device, "): ", cudaGetErrorString(e)));
  }
  cudaStream_t stream = nullptr;
  if (const cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
      e != cudaSuccess) {
    return absl::UnavailableError(absl::StrCat("cudaStreamCreate: ", cudaGetErrorString(e)));
  }
  // Non-blocking, so that a peer that never joins costs the timeout, not a hung thread.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t state = ncclCommInitRankConfig(&comm, 2, uid, rank, &config);
  const absl::Time deadline = absl::Now() + timeout;
  while (state == ncclInProgress && absl::Now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ncclCommGetAsyncError(comm, &state);
  }
  if (state != ncclSuccess) {
    if (comm != nullptr) ncclCommAbort(comm);
    cudaStreamDestroy(stream);
    return absl::UnavailableError(
        state == ncclInProgress
            ? absl::StrCat("the NCCL link's peer did not join within ",
                           absl::FormatDuration(timeout))
            : absl::StrCat("ncclCommInitRankConfig: ", ncclGetErrorString(state)));
  }
  return std::make_unique<NcclPeerLink>(comm, stream, device, rank, timeout);
}

}  // namespace kvserve::kernels
