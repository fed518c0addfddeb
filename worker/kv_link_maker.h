// How a worker makes device-to-device KV links (kernels/peer_link.h, docs/DISAGGREGATION.md):
// NCCL on a CUDA worker, one link per tensor-parallel rank (rank r's on the GPU rank r uses, to
// the peer's rank r); none otherwise (the CPU backend's KV moves in the router's KvChunks).
//
//   const KvLinkMaker maker = MakeKvLinkMaker(config);
//   if (!maker.kind.empty()) ASSIGN_OR_RETURN(KvLink link, maker.join(key, 1, absl::Seconds(30)));
//
// Its functions may be called from any thread; join blocks until the peer joined or the timeout.
#ifndef KVSERVE_WORKER_KV_LINK_MAKER_H_
#define KVSERVE_WORKER_KV_LINK_MAKER_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kernels/peer_link.h"
#include "worker/engine_config.h"

namespace kvserve::worker {

// One link per tensor-parallel rank, in rank order.
using KvLink = std::vector<std::unique_ptr<kernels::PeerLink>>;

struct KvLinkMaker {
  std::string kind;  // WorkerStatus.kv_link: "nccl", or empty when the worker makes none
  // A fresh link key, for side 0 to hand its peer (KvLinkStatus.nccl_id; opaque to the router):
  // NCCL's unique id of each rank's link, concatenated in rank order.
  std::function<absl::StatusOr<std::string>()> new_key;
  // Joins link `key` as side `side` (0 or 1), rank by rank; `timeout` bounds each rank's join
  // and each transfer. InvalidArgument when the key holds another number of ranks' ids (the
  // peer's tensor-parallel size is not this worker's).
  std::function<absl::StatusOr<KvLink>(const std::string& key, int side, absl::Duration timeout)>
      join;
};

KvLinkMaker MakeKvLinkMaker(const EngineConfig& config);

}  // namespace kvserve::worker

#endif  // KVSERVE_WORKER_KV_LINK_MAKER_H_
