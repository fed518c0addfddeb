// The KV transfer's ends on one rank's device pool (issue 44, docs/DISAGGREGATION.md): blocks
// out of the pool into the wire (kv_block_wire.h) and back. On a device backend they pass
// through a staging pool in the backend's pinned host memory: one CopyBlocks launch gathers a
// chunk's blocks there (or scatters them from there), and the CPU encodes or writes the wire
// against host memory, instead of one synchronous copy per layer's K, V and scale ranges of
// every block (64 to 128 for an 8B model's block). On the CPU backend the pool is host memory and
// is read and written directly.
//
//   KvStaging staging(device_kv, backend);
//   ASSIGN_OR_RETURN(std::string wire, staging.Encode(blocks, hashes));
//   staging.Write(blocks_read_from_wire, targets);
//
// Owned by the engine thread, as the pool is.
#ifndef KVSERVE_WORKER_KV_CACHE_KV_STAGING_H_
#define KVSERVE_WORKER_KV_CACHE_KV_STAGING_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/kv/block_hash.h"
#include "kernels/backend.h"
#include "kernels/peer_link.h"
#include "worker/kv_cache/kv_block_wire.h"
#include "worker/kv_cache/kv_storage.h"

namespace kvserve::worker {

class KvStaging {
 public:
  // `device`: the rank's device pool, read and written through `backend`; both outlive this.
  KvStaging(KvStorage& device, kernels::Backend& backend);

  // EncodeBlocks of `blocks` of the device pool; the steps that wrote them must be done.
  absl::StatusOr<std::string> Encode(absl::Span<const int> blocks,
                                     absl::Span<const BlockHash> hashes);
  // Writes blocks[i] (checked by ReadBlocks) into device block targets[i]; returns once they
  // are in the device pool.
  void Write(absl::Span<const WireBlock* const> blocks, absl::Span<const int> targets);

  // Blocks the staging pool holds now (0: none yet, or the CPU backend, which needs none).
  [[nodiscard]] int staged_capacity() const;

  // The device-to-device path (a device backend and an NCCL link; kv_block_wire.h's link
  // header). StageForLink gathers `blocks` into blocks [0, n) of an outgoing staging pool in
  // device memory and returns the link header with their fingerprint; StartSendStaged starts
  // moving them over the link (PeerLink::PollSend says when they are gone; nothing may be
  // staged before). ReceiveFromLink takes the chunk a checked header describes into an incoming
  // staging pool (so a receive never touches a send in flight) and compares the fingerprint
  // (DataLoss, naming both, when it differs; the device pool is not touched), and WriteReceived
  // copies received blocks [0, n) into device blocks `targets`.
  absl::StatusOr<std::string> StageForLink(absl::Span<const int> blocks,
                                           absl::Span<const BlockHash> hashes);
  absl::Status StartSendStaged(kernels::PeerLink& link);
  absl::Status ReceiveFromLink(kernels::PeerLink& link, const LinkHeader& header);
  void WriteReceived(absl::Span<const int> staged, absl::Span<const int> targets);

 private:
  bool Direct() const;
  // InvalidArgument naming a block outside the device pool.
  absl::Status InPool(absl::Span<const int> blocks) const;
  // FailedPrecondition on the CPU backend, which has no device link.
  absl::Status NeedsDevice() const;
  // `pool` grown (doubling) to hold at least `blocks`: in pinned host memory, or `device`.
  KvStorage& Grow(std::unique_ptr<KvStorage>& pool, int blocks, bool device);
  void Copy(KvStorage& from, KvStorage& to, absl::Span<const int32_t> src,
            absl::Span<const int32_t> dst);
  // Copies device blocks `blocks` into blocks [0, n) of `to`.
  void Gather(absl::Span<const int> blocks, KvStorage& to);

  KvStorage& device_;
  kernels::Backend& backend_;
  std::unique_ptr<KvStorage> staging_;             // pinned: the relay's wires
  std::unique_ptr<KvStorage> link_out_, link_in_;  // device: a link's outgoing, incoming chunk
  int staged_for_link_ = 0;                        // blocks StageForLink left in link_out_
};

}  // namespace kvserve::worker

#endif  // KVSERVE_WORKER_KV_CACHE_KV_STAGING_H_
