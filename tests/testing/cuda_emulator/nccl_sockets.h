// The emulated NCCL's ranks across processes (nccl.cc): every communicator's ranks join through
// an abstract Unix socket named after its unique id, so a communicator may span processes as
// NCCL's may span hosts. Rank 0 listens; each other rank connects and says its rank and process;
// rank 0 answers whether all ranks share one process (then the collectives meet in memory, as
// before). ncclSend and ncclRecv between rank 0 and another rank stream the bytes over that
// rank's connection, so the workers of a disaggregated pair, two processes, can move KV through
// the emulator. Point-to-point between two ranks other than 0 is not emulated (kvserve's links
// have two ranks).
//
//   ASSIGN_OR_RETURN(Mesh mesh, JoinMesh(id_bytes, nranks, rank, absl::Seconds(60)));
//   mesh.peers[0]->WriteAll(buffer, bytes);  // on a rank other than 0
//
// A PeerSocket is shared by the communicator and the stream work that uses it (which may run
// after an abort deleted the communicator); its calls are thread-safe.
#ifndef KVSERVE_TESTS_TESTING_CUDA_EMULATOR_NCCL_SOCKETS_H_
#define KVSERVE_TESTS_TESTING_CUDA_EMULATOR_NCCL_SOCKETS_H_

#include <atomic>
#include <cstddef>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace kvserve::emulation {

class PeerSocket {
 public:
  explicit PeerSocket(int fd) : fd_(fd) {}
  ~PeerSocket();
  PeerSocket(const PeerSocket&) = delete;
  PeerSocket& operator=(const PeerSocket&) = delete;

  // Every byte, or false once the connection broke (the peer closed or aborted, or Break).
  bool WriteAll(const void* data, size_t bytes);
  // Also false past `deadline`, with part of the bytes read.
  bool ReadAll(void* data, size_t bytes, absl::Time deadline = absl::InfiniteFuture());
  // Ends the connection: blocked and later calls return false, and the peer sees it closed.
  void Break();
  [[nodiscard]] bool broken() const { return broken_; }

 private:
  const int fd_;
  std::atomic<bool> broken_{false};
};

struct Mesh {
  // Rank 0: one per rank (null at 0). Other ranks: only [0], to rank 0.
  std::vector<std::shared_ptr<PeerSocket>> peers;
  bool one_process = true;
};

// Joins rank `rank` of `nranks` under `id`; Unavailable past `timeout` (a rank that never came).
absl::StatusOr<Mesh> JoinMesh(std::string_view id, int nranks, int rank, absl::Duration timeout);

}  // namespace kvserve::emulation

#endif  // KVSERVE_TESTS_TESTING_CUDA_EMULATOR_NCCL_SOCKETS_H_
