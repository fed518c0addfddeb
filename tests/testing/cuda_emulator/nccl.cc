// NCCL's calls that kvserve makes, for the emulated build (runtime.cc). A communicator's ranks
// join through sockets (nccl_sockets.h), so they may be threads of one process or processes.
// ncclSend and ncclRecv, queued on their streams, stream the bytes between rank 0 and another
// rank over those sockets: the two workers of a disaggregated pair move KV through them. The
// collectives need every rank in one process (the emulator's tensor-parallel groups): each,
// queued on its stream, is a rendezvous where the last rank to arrive computes the result for
// all (float32 sums, gathers and broadcasts, the only ones kvserve uses). Several ranks in one
// process is what lets the tests run tensor parallelism on the CUDA path, which the one-GPU
// machine cannot (NCCL refuses two ranks on one device). A rank that never arrives blocks the
// others until one of them aborts the communicator (ncclCommAbort, which kvserve's watchdog calls
// at its timeout): then the collectives waiting and those that come later return without a
// result, as NCCL's kernels that an abort ends leave garbage, and the sends and receives stop
// where they were. (Unlike NCCL, one rank's abort also ends its peers' collectives; a peer that
// closed its end is NCCL's remote error.) ncclGroupStart/End group nothing: the calls between
// them are queued in order, which is enough for a side that only sends or only receives.
#include <nccl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "tests/testing/cuda_emulator/nccl_sockets.h"
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
  std::shared_ptr<Clique> clique;  // null when the ranks are in several processes
  int rank;
  kvserve::emulation::Mesh mesh;
};

namespace {

size_t TypeBytes(ncclDataType_t type) {
  switch (type) {
    case ncclInt8:
    case ncclUint8:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
    default:
      return 0;
  }
}

// The socket to `peer`: rank 0 has one to each rank, the others one to rank 0.
std::shared_ptr<kvserve::emulation::PeerSocket> SocketTo(ncclComm_t comm, int peer) {
  const auto& peers = comm->mesh.peers;
  if (comm->rank != 0) return peer == 0 ? peers[0] : nullptr;
  return peer >= 1 && peer < static_cast<int>(peers.size()) ? peers[peer] : nullptr;
}

}  // namespace

extern "C" {

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  // Unique across the processes of a test: they share the machine's abstract socket names.
  static std::atomic<uint64_t> next{1};
  std::memset(id->internal, 0, sizeof(id->internal));
  const uint64_t parts[3] = {
      static_cast<uint64_t>(getpid()), next++,
      static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count())};
  std::memcpy(id->internal, parts, sizeof(parts));
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  if (nranks < 1 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
  const std::string key(id.internal, sizeof(id.internal));
  absl::StatusOr<kvserve::emulation::Mesh> mesh =
      kvserve::emulation::JoinMesh(key, nranks, rank, absl::Seconds(120));
  if (!mesh.ok()) return ncclSystemError;
  if (!mesh->one_process) {
    *comm = new ncclComm{nullptr, rank, *std::move(mesh)};
    return ncclSuccess;
  }
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
  *comm = new ncclComm{std::move(clique), rank, *std::move(mesh)};
  return ncclSuccess;
}

// Joins as ncclCommInitRank does, blocking whatever config->blocking says (a rank that never
// comes fails the join after 120 s).
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t*) {
  return ncclCommInitRank(comm, nranks, id, rank);
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm->clique != nullptr) comm->clique->Abort();
  for (const auto& peer : comm->mesh.peers) {
    if (peer != nullptr) peer->Break();
  }
  return ncclCommDestroy(comm);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* error) {
  *error = ncclSuccess;
  for (const auto& peer : comm->mesh.peers) {
    if (peer != nullptr && peer->broken()) *error = ncclRemoteError;
  }
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclInvalidArgument:
      return "invalid argument (emulated NCCL)";
    case ncclRemoteError:
      return "remote process exited or there was a network error (emulated NCCL: the peer's "
             "socket closed)";
    case ncclSystemError:
      return "system call failed (emulated NCCL: a rank never joined)";
    default:
      return "unsupported by the emulated NCCL";
  }
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  if (comm->clique == nullptr) return ncclInvalidUsage;  // ranks in several processes
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
  if (comm->clique == nullptr) return ncclInvalidUsage;  // ranks in several processes
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
  if (comm->clique == nullptr) return ncclInvalidUsage;  // ranks in several processes
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

ncclResult_t ncclSend(const void* send, size_t count, ncclDataType_t type, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  std::shared_ptr<kvserve::emulation::PeerSocket> socket = SocketTo(comm, peer);
  if (socket == nullptr || TypeBytes(type) == 0) return ncclInvalidUsage;
  const size_t bytes = count * TypeBytes(type);
  kvserve::emulation::Enqueue(stream, [=] { socket->WriteAll(send, bytes); });
  return ncclSuccess;
}

ncclResult_t ncclRecv(void* recv, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  std::shared_ptr<kvserve::emulation::PeerSocket> socket = SocketTo(comm, peer);
  if (socket == nullptr || TypeBytes(type) == 0) return ncclInvalidUsage;
  const size_t bytes = count * TypeBytes(type);
  kvserve::emulation::Enqueue(stream, [=] { socket->ReadAll(recv, bytes); });
  return ncclSuccess;
}

ncclResult_t ncclGroupStart() { return ncclSuccess; }
ncclResult_t ncclGroupEnd() { return ncclSuccess; }

}  // extern "C"
