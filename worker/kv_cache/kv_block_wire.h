// KV blocks as bytes between workers: the wire format of the KV transfer path (issue 44). A
// block travels exactly as a pool stores it (kv_storage.h): per layer, its K and V codes and
// their fp16 scales in the cache's format, never re-quantized, so an int4 cache moves about a
// quarter of a bf16 cache's bytes. Each block carries its block hash and an XXH3-64 checksum of
// hash and bytes; the receiver checks every block, and the shape against its own, before it
// writes any (nothing half-written is ever read).
//
// Layout (integers little-endian):
//   header  "KVBW", u16 version (1), u16 0, u32 blocks, u32 layers, u32 kv_heads,
//           u32 block_size, u32 head_dim, u16 n + n bytes of the formats ("k/v;k/v;..." of
//           KvFormat::Describe per layer)
//   blocks  16-byte hash (BlockHash::ToBytes), the block's bytes (each layer: K codes, V codes,
//           K scales, V scales), u64 XXH3-64 of hash and bytes
//
//   ASSIGN_OR_RETURN(std::string wire, EncodeBlocks(storage, backend, blocks, hashes));
//   ASSIGN_OR_RETURN(std::vector<WireBlock> got, ReadBlocks(wire, receiver_storage));
//   for (size_t i = 0; i < got.size(); ++i) WriteBlock(receiver_storage, backend, target[i],
//   got[i]);
//
// `storage` is one whose memory the backend's Upload and Download reach: the device pool on any
// backend, and on the CPU backend the host pool too. Pure functions of their arguments; the
// storage's owner (the engine thread) calls them.
#ifndef KVSERVE_WORKER_KV_CACHE_KV_BLOCK_WIRE_H_
#define KVSERVE_WORKER_KV_CACHE_KV_BLOCK_WIRE_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/kv/block_hash.h"
#include "kernels/backend.h"
#include "worker/kv_cache/kv_storage.h"

namespace kvserve::worker {

// One block as read from the wire: its hash and its bytes (a view into the wire).
struct WireBlock {
  BlockHash hash;
  std::string_view bytes;
};

// The bytes one block of `storage` takes on the wire (without hash and checksum).
int64_t WireBlockBytes(KvStorage& storage);

// Blocks `blocks` of `storage`, read through `backend` (device memory on a GPU), with their
// hashes. InvalidArgument for a block outside the pool or counts that differ.
absl::StatusOr<std::string> EncodeBlocks(KvStorage& storage, kernels::Backend& backend,
                                         absl::Span<const int> blocks,
                                         absl::Span<const BlockHash> hashes);

// The same from a pool in host memory (a host-tier KvStorage: pinned on CUDA), read directly.
absl::StatusOr<std::string> EncodeHostBlocks(KvStorage& host_storage, absl::Span<const int> blocks,
                                             absl::Span<const BlockHash> hashes);

// Every block of `wire`, checked: FailedPrecondition naming the field when its shape (layers,
// heads, block size, head size, formats) is not `storage`'s; DataLoss naming the block for a
// checksum that does not match; InvalidArgument for a truncated or malformed wire.
absl::StatusOr<std::vector<WireBlock>> ReadBlocks(std::string_view wire, KvStorage& storage);

// Writes one checked block into block `block` of `storage` through `backend`.
void WriteBlock(KvStorage& storage, kernels::Backend& backend, int block, const WireBlock& b);
// The same into a pool in host memory, written directly.
void WriteHostBlock(KvStorage& host_storage, int block, const WireBlock& b);

// The device-to-device path (an NCCL link, kernels/peer_link.h): a chunk's blocks gathered
// into blocks [0, n) of a staging pool in device memory cross the link as the pool's leading
// ranges, layer by layer (K codes, V codes, K scales, V scales, each n blocks long), while the
// header crosses the router: the same header as above under magic "KVBL", each block's hash,
// the fingerprint (kernels/fingerprint.h) of those ranges, and an XXH3-64 of all that.
std::vector<kernels::ByteRange> LeadingRanges(KvStorage& storage, int blocks);
// Layer streaming: blocks `blocks`' ranges in one layer (for each block: K codes, V codes,
// K scales, V scales), as the sender and the receiver queue them.
std::vector<kernels::ByteRange> LayerRanges(KvStorage& storage, int layer,
                                            absl::Span<const int> blocks);
std::string EncodeLinkHeader(KvStorage& storage, absl::Span<const BlockHash> hashes,
                             uint64_t fingerprint);

struct LinkHeader {
  std::vector<BlockHash> hashes;
  uint64_t fingerprint = 0;
};
// Checked as ReadBlocks checks a wire's header; DataLoss when its checksum fails.
absl::StatusOr<LinkHeader> ReadLinkHeader(std::string_view wire, KvStorage& storage);

}  // namespace kvserve::worker

#endif  // KVSERVE_WORKER_KV_CACHE_KV_BLOCK_WIRE_H_
