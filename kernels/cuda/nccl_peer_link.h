// PeerLink over NCCL: a communicator of two ranks, one GPU in each of two processes, made once
// when the router pairs a prefill worker with a decode worker (as NCCL is meant to be used: a
// communicator is costly to make and cheap to use). Rank 0 makes the id and the router relays
// it to rank 1; both join; then ncclSend / ncclRecv move KV chunks on the link's own stream. A
// transfer is waited for by a helper thread while the caller watches the clock: past the
// timeout the communicator is aborted (which ends NCCL's kernels) and the link is dead. (NCCL
// refuses two ranks on one GPU: a one-GPU machine cannot run a link; the emulated build runs
// both ends, in threads or processes.)
//
//   ASSIGN_OR_RETURN(std::string id, NewNcclPeerId());                    // rank 0
//   ASSIGN_OR_RETURN(auto link, JoinNcclPeerLink(id, /*rank=*/0, device, absl::Seconds(30)));
//
// This header includes no CUDA header.
#ifndef KVSERVE_KERNELS_CUDA_NCCL_PEER_LINK_H_
#define KVSERVE_KERNELS_CUDA_NCCL_PEER_LINK_H_

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kernels/peer_link.h"

namespace kvserve::kernels {

// A fresh id for a link (NCCL's unique id, 128 bytes): Unavailable without NCCL.
absl::StatusOr<std::string> NewNcclPeerId();

// Joins the link `id` as `rank` (0 or 1) with `device`; returns once the peer joined too.
// InvalidArgument for an id that is not one; Unavailable when the peer does not join within
// `timeout`, which also bounds every transfer.
absl::StatusOr<std::unique_ptr<PeerLink>> JoinNcclPeerLink(std::string_view id, int rank,
                                                           int device, absl::Duration timeout);

}  // namespace kvserve::kernels

#endif  // KVSERVE_KERNELS_CUDA_NCCL_PEER_LINK_H_
