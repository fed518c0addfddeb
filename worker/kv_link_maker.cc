#include "worker/kv_link_maker.h"

#ifdef KVSERVE_WITH_CUDA
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cuda/nccl_communicator.h"
#include "kernels/cuda/nccl_peer_link.h"
#endif

namespace kvserve::worker {

KvLinkMaker MakeKvLinkMaker(const EngineConfig& config) {
  KvLinkMaker maker;
#ifdef KVSERVE_WITH_CUDA
  const int ranks = config.parallel.tensor_parallel_size;
  if (config.backend.device != Device::kCuda || kernels::CudaDeviceCount() < ranks) {
    return maker;
  }
  maker.kind = "nccl";
  maker.new_key = [ranks]() -> absl::StatusOr<std::string> {
    std::string key;
    for (int r = 0; r < ranks; ++r) {
      ASSIGN_OR_RETURN(std::string id, kernels::NewNcclPeerId());
      key += id;
    }
    return key;
  };
  maker.join = [ranks](const std::string& key, int side,
                       absl::Duration timeout) -> absl::StatusOr<KvLink> {
    if (key.empty() || key.size() % ranks != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("a KV link key of ", key.size(), " bytes does not split into ", ranks,
                       " ranks' ids (the peer's tensor-parallel size must be this worker's)"));
    }
    const size_t each = key.size() / ranks;
    KvLink link;
    for (int r = 0; r < ranks; ++r) {  // rank r runs on GPU r (ModelRunner::CheckDevices)
      ASSIGN_OR_RETURN(std::unique_ptr<kernels::PeerLink> one,
                       kernels::JoinNcclPeerLink(std::string_view(key).substr(r * each, each), side,
                                                 /*device=*/r, timeout));
      link.push_back(std::move(one));
    }
    return link;
  };
#endif
  return maker;
}

}  // namespace kvserve::worker
