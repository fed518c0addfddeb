// How a worker makes device-to-device KV links (kernels/peer_link.h, docs/DISAGGREGATION.md):
// NCCL on a CUDA worker of one tensor-parallel rank, on the GPU its rank 0 uses; none otherwise
// (the CPU backend's KV moves in the router's KvChunks, and links with tensor parallelism on
// CUDA are not built yet).
//
//   const KvLinkMaker maker = MakeKvLinkMaker(config);
//   if (!maker.kind.empty()) ASSIGN_OR_RETURN(auto link, maker.join(id, 1, absl::Seconds(30)));
//
// Its functions may be called from any thread; join blocks until the peer joined or the timeout.
#ifndef KVSERVE_WORKER_KV_LINK_MAKER_H_
#define KVSERVE_WORKER_KV_LINK_MAKER_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kernels/peer_link.h"
#include "worker/engine_config.h"

namespace kvserve::worker {

struct KvLinkMaker {
  std::string kind;  // WorkerStatus.kv_link: "nccl", or empty when the worker makes none
  // A fresh link id, for rank 0 to hand its peer.
  std::function<absl::StatusOr<std::string>()> new_id;
  // Joins link `id` as `rank` (0 or 1); `timeout` also bounds each transfer.
  std::function<absl::StatusOr<std::unique_ptr<kernels::PeerLink>>(const std::string& id, int rank,
                                                                   absl::Duration timeout)>
      join;
};

KvLinkMaker MakeKvLinkMaker(const EngineConfig& config);

}  // namespace kvserve::worker

#endif  // KVSERVE_WORKER_KV_LINK_MAKER_H_
