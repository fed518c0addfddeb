#include "kernels/cuda/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"

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
      : comm_(comm),
        stream_(stream),
        device_(device),
        rank_(rank),
        size_(size),
        timeout_(timeout) {}

  ~NcclCommunicator() override {
    cudaSetDevice(device_);
    if (comm_ != nullptr) ncclCommDestroy(comm_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view name() const override { return "nccl"; }

  absl::Status AllReduceSum(float* data, size_t count) override {
    return Run("all-reduce", [&] {
      return ncclAllReduce(data, data, count, ncclFloat32, ncclSum, comm_, stream_);
    });
  }

  absl::Status AllGather(const float* in, size_t count, float* out) override {
    return Run("all-gather",
               [&] { return ncclAllGather(in, out, count, ncclFloat32, comm_, stream_); });
  }

  absl::Status Broadcast(float* data, size_t count, int root) override {
    return Run("broadcast",
               [&] { return ncclBroadcast(data, data, count, ncclFloat32, root, comm_, stream_); });
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
  template <typename Fn>
  absl::Status Run(const char* what, Fn enqueue) {
    if (comm_ == nullptr) return absl::FailedPreconditionError("the NCCL communicator was aborted");
    cudaSetDevice(device_);
    if (absl::Status s = NcclStatus(enqueue(), what); !s.ok()) return s;
    // Watchdog: poll the stream and NCCL's async error until done or past the deadline.
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::microseconds(absl::ToInt64Microseconds(timeout_));
    while (true) {
      const cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) return absl::OkStatus();
      if (q != cudaErrorNotReady) return CudaStatus(q, what);
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress) {
        ncclCommAbort(comm_);
        comm_ = nullptr;
        return NcclStatus(async, what);
      }
      if (std::chrono::steady_clock::now() > deadline) {
        ncclCommAbort(comm_);
        comm_ = nullptr;
        return absl::DeadlineExceededError(
            absl::StrCat("nccl ", what, " timed out after ", absl::FormatDuration(timeout_)));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  ncclComm_t comm_;
  cudaStream_t stream_;
  int device_, rank_, size_;
  absl::Duration timeout_;
  void* scratch_ = nullptr;
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
