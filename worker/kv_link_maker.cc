#include "worker/kv_link_maker.h"

#ifdef KVSERVE_WITH_CUDA
#include "kernels/cuda/nccl_communicator.h"
#include "kernels/cuda/nccl_peer_link.h"
#endif

namespace kvserve::worker {

KvLinkMaker MakeKvLinkMaker(const EngineConfig& config) {
  KvLinkMaker maker;
#ifdef KVSERVE_WITH_CUDA
  if (config.backend.device != Device::kCuda || config.parallel.tensor_parallel_size != 1 ||
      kernels::CudaDeviceCount() == 0) {
    return maker;
  }
  maker.kind = "nccl";
  maker.new_id = [] { return kernels::NewNcclPeerId(); };
  maker.join = [](const std::string& id, int rank, absl::Duration timeout) {
    return kernels::JoinNcclPeerLink(id, rank, /*device=*/0, timeout);
  };
#endif
  return maker;
}

}  // namespace kvserve::worker
