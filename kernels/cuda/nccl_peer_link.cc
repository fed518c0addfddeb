#include "kernels/cuda/nccl_peer_link.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
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
    if (send_ && comm_ != nullptr) {  // a send the peer never took: end its kernels
      ncclCommAbort(comm_);
      comm_ = nullptr;
    }
    send_.reset();
    if (comm_ != nullptr) ncclCommDestroy(comm_);
    cudaStreamDestroy(stream_);
  }

  std::string_view name() const override { return "nccl"; }

  absl::Status Send(absl::Span<const ByteRange> ranges) override {
    RETURN_IF_ERROR(StartSend(ranges));
    while (true) {
      absl::StatusOr<bool> done = PollSend();
      if (!done.ok() || *done) return done.status();
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  absl::Status Receive(absl::Span<const ByteRange> ranges) override {
    if (send_) return absl::FailedPreconditionError("a receive while a send is in flight");
    const absl::Time deadline = absl::Now() + timeout_;
    RETURN_IF_ERROR(Enqueue("receive", ranges, deadline, [&](const ByteRange& r) {
      return ncclRecv(const_cast<void*>(r.data), r.bytes, ncclUint8, 1 - rank_, comm_, stream_);
    }));
    StreamWait wait(stream_, device_);
    while (true) {
      absl::StatusOr<bool> done = Check("receive", wait, deadline, absl::Milliseconds(1));
      if (!done.ok() || *done) return done.status();
    }
  }

  absl::Status StartSend(absl::Span<const ByteRange> ranges) override {
    if (!failure_.ok()) return failure_;
    if (send_) return absl::FailedPreconditionError("a send is still in flight on the link");
    const absl::Time deadline = absl::Now() + timeout_;
    RETURN_IF_ERROR(Enqueue("send", ranges, deadline, [&](const ByteRange& r) {
      return ncclSend(r.data, r.bytes, ncclUint8, 1 - rank_, comm_, stream_);
    }));
    send_ = std::make_unique<StreamWait>(stream_, device_);
    send_deadline_ = deadline;
    return absl::OkStatus();
  }

  absl::StatusOr<bool> PollSend() override {
    if (!failure_.ok()) return failure_;
    if (!send_) return true;
    absl::StatusOr<bool> done = Check("send", *send_, send_deadline_, absl::ZeroDuration());
    if (!done.ok() || *done) send_.reset();
    return done;
  }

 private:
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
    send_.reset();  // its synchronize returns once the abort ended the kernels
    return status;
  }

  ncclComm_t comm_;  // null once aborted
  const cudaStream_t stream_;
  const int device_, rank_;
  const absl::Duration timeout_;
  absl::Status failure_;
  std::unique_ptr<StreamWait> send_;  // the send in flight (StartSend), if any
  absl::Time send_deadline_;
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
