// NCCL's calls that kvserve makes, for the emulated build (runtime.cc): the ranks of a
// communicator are threads of this process, and each collective, queued on its stream, is a
// rendezvous where the last rank to arrive computes the result for all (float32 sums, gathers and
// broadcasts, the only ones kvserve uses). Several ranks in one process is what lets the tests run
// tensor parallelism on the CUDA path, which the one-GPU machine cannot (NCCL refuses two ranks on
// one device). A rank that never arrives blocks the others until one of them aborts the
// communicator (ncclCommAbort, which kvserve's watchdog calls at its timeout): then the collectives
// waiting and those that come later return without a result, as NCCL's kernels that an abort ends
// leave garbage. (Unlike NCCL, one rank's abort also ends its peers' collectives.)
#include <nccl.h>

#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "tests/testing/cuda_emulator/streams.h"

namespace {

struct Call {
  const float* send;
  float* recv;
};

// The ranks that share a unique id.
struct Clique {
  explicit Clique(int n) : size(n), calls(n) {}

  // Blocks until every rank made the call; the last one runs `op` on all of them. Returns
  // without running it once a rank aborted.
  template <typename Op>
  void Rendezvous(int rank, Call call, Op op) ABSL_LOCKS_EXCLUDED(mu) {
    absl::MutexLock lock(&mu);
    if (aborted) return;
    const uint64_t gen = generation;
    calls[rank] = call;
    if (++arrived == size) {
      op(calls);
      arrived = 0;
      ++generation;
      cv.SignalAll();
    } else {
      while (generation == gen && !aborted) cv.Wait(&mu);
    }
  }

  void Abort() ABSL_LOCKS_EXCLUDED(mu) {
    {
      absl::MutexLock lock(&mu);
      aborted = true;
    }
    cv.SignalAll();
  }

  const int size;
  absl::Mutex mu;
  absl::CondVar cv;  // signalled when the last rank arrives and on abort
  int arrived ABSL_GUARDED_BY(mu) = 0;
  uint64_t generation ABSL_GUARDED_BY(mu) = 0;
  bool aborted ABSL_GUARDED_BY(mu) = false;
  std::vector<Call> calls ABSL_GUARDED_BY(mu);
};

ABSL_CONST_INIT absl::Mutex cliques_mu(absl::kConstInit);
// By unique id, while the ranks join.
std::map<std::string, std::shared_ptr<Clique>> cliques ABSL_GUARDED_BY(cliques_mu);

}  // namespace

struct ncclComm {
  std::shared_ptr<Clique> clique;
  int rank;
};

extern "C" {

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  static std::atomic<uint64_t> next{1};
  std::memset(id->internal, 0, sizeof(id->internal));
  const uint64_t n = next++;
  std::memcpy(id->internal, &n, sizeof(n));
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  if (nranks < 1 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
  const std::string key(id.internal, sizeof(id.internal));
  std::shared_ptr<Clique> clique;
  {
    absl::MutexLock lock(&cliques_mu);
    std::shared_ptr<Clique>& c = cliques[key];
    if (c == nullptr) c = std::make_shared<Clique>(nranks);
    if (c->size != nranks) return ncclInvalidArgument;
    clique = c;
  }
  // Like NCCL, initialisation returns once every rank has joined.
  clique->Rendezvous(rank, {}, [&](std::vector<Call>&) {
    absl::MutexLock lock(&cliques_mu);
    cliques.erase(key);
  });
  *comm = new ncclComm{std::move(clique), rank};
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  comm->clique->Abort();
  return ncclCommDestroy(comm);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t, ncclResult_t* error) {
  *error = ncclSuccess;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclInvalidArgument:
      return "invalid argument (emulated NCCL)";
    default:
      return "unsupported by the emulated NCCL";
  }
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  if (type != ncclFloat32 || op != ncclSum) return ncclInvalidUsage;
  // The queued call outlives an aborted (deleted) comm: it holds the clique and the rank.
  kvserve::emulation::Enqueue(stream, [=, clique = comm->clique, rank = comm->rank] {
    clique->Rendezvous(rank, {static_cast<const float*>(send), static_cast<float*>(recv)},
                       [count](std::vector<Call>& calls) {
                         std::vector<float> sum(count, 0.0f);
                         for (const Call& c : calls) {
                           for (size_t i = 0; i < count; ++i) sum[i] += c.send[i];
                         }
                         for (const Call& c : calls)
                           std::memcpy(c.recv, sum.data(), count * sizeof(float));
                       });
  });
  return ncclSuccess;
}

ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t stream) {
  if (type != ncclFloat32) return ncclInvalidUsage;
  kvserve::emulation::Enqueue(stream, [=, clique = comm->clique, rank = comm->rank] {
    clique->Rendezvous(rank, {static_cast<const float*>(send), static_cast<float*>(recv)},
                       [count](std::vector<Call>& calls) {
                         const size_t n = calls.size();
                         std::vector<float> all(n * count);
                         for (size_t r = 0; r < n; ++r) {
                           std::memcpy(&all[r * count], calls[r].send, count * sizeof(float));
                         }
                         for (const Call& c : calls)
                           std::memcpy(c.recv, all.data(), all.size() * sizeof(float));
                       });
  });
  return ncclSuccess;
}

ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type,
                           int root, ncclComm_t comm, cudaStream_t stream) {
  if (type != ncclFloat32 || root < 0 || root >= comm->clique->size) return ncclInvalidUsage;
  kvserve::emulation::Enqueue(stream, [=, clique = comm->clique, rank = comm->rank] {
    clique->Rendezvous(rank, {static_cast<const float*>(send), static_cast<float*>(recv)},
                       [count, root](std::vector<Call>& calls) {
                         std::vector<float> data(calls[root].send, calls[root].send + count);
                         for (const Call& c : calls)
                           std::memcpy(c.recv, data.data(), count * sizeof(float));
                       });
  });
  return ncclSuccess;
}

}  // extern "C"
