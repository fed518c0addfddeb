#include "kernels/cuda/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace kvserve::kernels {
namespace {

absl::Status CudaStatus(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(e)));
}

absl::Status NcclStatus(ncclResult_t r, const char* what) {
  if (r == ncclSuccess || r == ncclInProgress) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", ncclGetErrorString(r)));
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, cudaStream_t stream, int device, int rank, int size,
                   absl::Duration timeout)
      : stream_(stream),
        device_(device),
        rank_(rank),
        size_(size),
        timeout_(timeout),
        comm_(comm) {}

  ~NcclCommunicator() override {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    wake_.SignalAll();
    if (watchdog_.joinable()) watchdog_.join();
    cudaSetDevice(device_);
    for (const Pending& p : pending_) cudaEventDestroy(p.done);
    for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
    if (comm_ != nullptr) ncclCommDestroy(comm_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view name() const override { return "nccl"; }

  bool stream_ordered() const override { return true; }

  absl::Status EnqueueAllReduceSum(float* data, size_t count, void* stream) override {
    return Enqueue("all-reduce", stream, [&](ncclComm_t comm, cudaStream_t s) {
      return ncclAllReduce(data, data, count, ncclFloat32, ncclSum, comm, s);
    });
  }
  absl::Status EnqueueAllGather(const float* in, size_t count, float* out, void* stream) override {
    return Enqueue("all-gather", stream, [&](ncclComm_t comm, cudaStream_t s) {
      return ncclAllGather(in, out, count, ncclFloat32, comm, s);
    });
  }
  absl::Status status() override {
    absl::MutexLock lock(&mu_);
    if (failure_.ok() && comm_ != nullptr) {
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress) Abort(NcclStatus(async, "a collective"));
    }
    return failure_;
  }
  absl::Status EnqueueWatch(void* stream) override {
    return Enqueue("collectives of a replayed graph", stream,
                   [](ncclComm_t, cudaStream_t) { return ncclSuccess; });
  }

  absl::Status AllReduceSum(float* data, size_t count) override {
    return Run("all-reduce", [&](ncclComm_t comm, cudaStream_t s) {
      return ncclAllReduce(data, data, count, ncclFloat32, ncclSum, comm, s);
    });
  }

  absl::Status AllGather(const float* in, size_t count, float* out) override {
    return Run("all-gather", [&](ncclComm_t comm, cudaStream_t s) {
      return ncclAllGather(in, out, count, ncclFloat32, comm, s);
    });
  }

  absl::Status Broadcast(float* data, size_t count, int root) override {
    return Run("broadcast", [&](ncclComm_t comm, cudaStream_t s) {
      return ncclBroadcast(data, data, count, ncclFloat32, root, comm, s);
    });
  }

  absl::Status Barrier() override {
    // An all-reduce of one float on a scratch buffer: returns when every rank got here.
    if (scratch_ == nullptr) {
      cudaSetDevice(device_);
      if (absl::Status s = CudaStatus(cudaMalloc(&scratch_, sizeof(float)), "cudaMalloc"); !s.ok())
        return s;
    }
    return AllReduceSum(static_cast<float*>(scratch_), 1);
  }

 private:
  struct Pending {
    const char* what;
    cudaEvent_t done;  // recorded after the collective on the caller's stream
    std::chrono::steady_clock::time_point deadline;
  };

  std::chrono::microseconds Timeout() const {
    return std::chrono::microseconds(absl::ToInt64Microseconds(timeout_));
  }

  // Under mu_: aborts the communicator (which ends its kernels still running) and keeps
  // `status` for every later call.
  void Abort(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    failure_ = std::move(status);
    if (comm_ != nullptr) ncclCommAbort(comm_);
    comm_ = nullptr;
  }

  // The watchdog of stream-ordered collectives: the oldest pending one is done, failed
  // (NCCL's async error), or aborted past its deadline (the timeout from its enqueue or from
  // the previous one's end, whichever is later); polled every 100 µs while one is pending.
  void Watch() ABSL_LOCKS_EXCLUDED(mu_) {
    cudaSetDevice(device_);
    absl::MutexLock lock(&mu_);
    while (!stop_) {
      if (pending_.empty() || comm_ == nullptr) {
        wake_.Wait(&mu_);
        continue;
      }
      const Pending p = pending_.front();
      const cudaError_t q = cudaEventQuery(p.done);
      if (q == cudaSuccess) {
        pending_.pop_front();
        free_events_.push_back(p.done);
        // The next one's time counts from here at the earliest: the kernels queued between
        // two collectives (a layer's half) are not the peers' stall.
        if (!pending_.empty()) {
          pending_.front().deadline =
              std::max(pending_.front().deadline, std::chrono::steady_clock::now() + Timeout());
        }
        continue;
      }
      if (q != cudaErrorNotReady) {
        Abort(CudaStatus(q, p.what));
        continue;
      }
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress) {
        Abort(NcclStatus(async, p.what));
      } else if (std::chrono::steady_clock::now() > p.deadline) {
        Abort(absl::DeadlineExceededError(
            absl::StrCat("nccl ", p.what, " timed out after ", absl::FormatDuration(timeout_))));
      } else {
        wake_.WaitWithTimeout(&mu_, absl::Microseconds(100));
      }
    }
  }

  // On the caller's stream, so the collective is ordered with the kernels around it and the
  // host does not wait; an event after it goes to the watchdog thread, which aborts the
  // communicator when the collective fails or outlives the timeout. A stream recording a graph
  // records the collective and no event (one could not be queried from the watchdog): the
  // replays are watched through EnqueueWatch.
  template <typename Fn>
  absl::Status Enqueue(const char* what, void* stream, Fn launch) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (!failure_.ok()) return failure_;
    if (comm_ == nullptr) return absl::FailedPreconditionError("the NCCL communicator was aborted");
    cudaSetDevice(device_);
    const auto s = static_cast<cudaStream_t>(stream);
    if (absl::Status st = NcclStatus(launch(comm_, s), what); !st.ok()) return st;
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (absl::Status st = CudaStatus(cudaStreamIsCapturing(s, &capture), "cudaStreamIsCapturing");
        !st.ok()) {
      return st;
    }
    if (capture != cudaStreamCaptureStatusNone) return absl::OkStatus();
    cudaEvent_t done = nullptr;
    if (free_events_.empty()) {
      if (absl::Status st = CudaStatus(cudaEventCreateWithFlags(&done, cudaEventDisableTiming),
                                       "cudaEventCreate");
          !st.ok()) {
        return st;
      }
    } else {
      done = free_events_.back();
      free_events_.pop_back();
    }
    if (absl::Status st = CudaStatus(cudaEventRecord(done, s), "cudaEventRecord"); !st.ok()) {
      free_events_.push_back(done);
      return st;
    }
    pending_.push_back({what, done, std::chrono::steady_clock::now() + Timeout()});
    if (!watchdog_.joinable()) watchdog_ = std::thread([this] { Watch(); });
    wake_.SignalAll();
    return absl::OkStatus();
  }

  template <typename Fn>
  absl::Status Run(const char* what, Fn enqueue) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (!failure_.ok()) return failure_;
    if (comm_ == nullptr) return absl::FailedPreconditionError("the NCCL communicator was aborted");
    cudaSetDevice(device_);
    // After the stream-ordered collectives still pending: one communicator's collectives must
    // run in the order they were issued, whatever their streams.
    if (!pending_.empty()) {
      if (absl::Status s = CudaStatus(cudaStreamWaitEvent(stream_, pending_.back().done, 0),
                                      "cudaStreamWaitEvent");
          !s.ok()) {
        return s;
      }
    }
    if (absl::Status s = NcclStatus(enqueue(comm_, stream_), what); !s.ok()) return s;
    // Watchdog: poll the stream and NCCL's async error until done or past the deadline.
    const auto deadline = std::chrono::steady_clock::now() + Timeout();
    while (true) {
      const cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) return absl::OkStatus();
      if (q != cudaErrorNotReady) return CudaStatus(q, what);
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress) {
        Abort(NcclStatus(async, what));
        return failure_;
      }
      if (std::chrono::steady_clock::now() > deadline) {
        Abort(absl::DeadlineExceededError(
            absl::StrCat("nccl ", what, " timed out after ", absl::FormatDuration(timeout_))));
        return failure_;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  // Constant after construction.
  cudaStream_t stream_;
  int device_, rank_, size_;
  absl::Duration timeout_;

  void* scratch_ = nullptr;  // the caller's thread (Barrier)

  // Shared with the watchdog thread: the communicator, the stream-ordered collectives not yet
  // seen done (oldest first), their events' pool, and the error that aborted it.
  absl::Mutex mu_;
  absl::CondVar wake_;                    // signalled on a new pending collective and on stop
  ncclComm_t comm_ ABSL_GUARDED_BY(mu_);  // null once aborted
  std::deque<Pending> pending_ ABSL_GUARDED_BY(mu_);
  std::vector<cudaEvent_t> free_events_ ABSL_GUARDED_BY(mu_);
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread watchdog_;
};

}  // namespace

int CudaDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> CreateNcclGroup(
    const std::vector<int>& devices, absl::Duration timeout) {
  const int size = static_cast<int>(devices.size());
  if (size < 1) return absl::InvalidArgumentError("a communicator group needs at least one rank");
  if (CudaDeviceCount() == 0) return absl::UnavailableError("no CUDA device");
  ncclUniqueId id;
  if (absl::Status s = NcclStatus(ncclGetUniqueId(&id), "ncclGetUniqueId"); !s.ok()) {
    return absl::UnavailableError(s.message());
  }
  std::vector<ncclComm_t> comms(size, nullptr);
  std::vector<cudaStream_t> streams(size, nullptr);
  std::vector<absl::Status> status(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      status[r] = CudaStatus(cudaSetDevice(devices[r]), "cudaSetDevice");
      if (status[r].ok())
        status[r] = CudaStatus(cudaStreamCreateWithFlags(&streams[r], cudaStreamNonBlocking),
                               "cudaStreamCreate");
      if (status[r].ok())
        status[r] = NcclStatus(ncclCommInitRank(&comms[r], size, id, r), "ncclCommInitRank");
    });
  }
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : status) {
    if (!s.ok()) return absl::UnavailableError(s.message());
  }
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < size; ++r) {
    out.push_back(
        std::make_unique<NcclCommunicator>(comms[r], streams[r], devices[r], r, size, timeout));
  }
  return out;
}

}  // namespace kvserve::kernels
