// A prompt's cached KV blocks leaving one engine and joining another's prefix cache
// (docs/DISAGGREGATION.md): through wires the router relays (Export, Import) or over
// device-to-device links (StageForLink, StartSendStaged, ReceiveFromLink); and, for devices
// that keep no KV, the bookkeeping alone (CachedRun, Adopt). The layer streams cache the
// blocks they receive through it too (Allocate, CheckChain, CacheWritten).
//
// A part of the Engine, which owns it and calls it on the engine thread between steps (no step
// in flight: the Engine settles first). It owns each rank's transfer staging; the runner, the
// KV cache manager and the prompt hashing are the engine's.
#ifndef KVSERVE_WORKER_PREFIX_TRANSFER_H_
#define KVSERVE_WORKER_PREFIX_TRANSFER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/kv/block_hash.h"
#include "kernels/peer_link.h"
#include "worker/kv_cache/kv_cache_manager.h"
#include "worker/kv_cache/kv_staging.h"
#include "worker/model_runner.h"

namespace kvserve::worker {

// A chunk of a prompt's device-cached blocks: one wire (kv_block_wire.h) per tensor-parallel
// rank, each with that rank's KV heads, or over a link each rank's link header.
struct PrefixChunk {
  std::vector<std::string> wires;  // one per rank
  int first_block = 0;
  int num_blocks = 0;
  bool more = false;  // the cached run goes on past this chunk
};

using PeerLinks = absl::Span<const std::unique_ptr<kernels::PeerLink>>;

class PrefixTransfer {
 public:
  // The hashes of `prompt`'s full blocks, as a request with `cache_salt` gets them.
  using PromptHashes = std::function<absl::StatusOr<std::vector<BlockHash>>(
      absl::Span<const int32_t> prompt, const std::string& cache_salt)>;

  // `runner` and `kv` are the engine's and outlive this.
  PrefixTransfer(ModelRunner* runner, KvCacheManager* kv, int block_size, PromptHashes hashes)
      : runner_(runner), kv_(kv), block_size_(block_size), hashes_(std::move(hashes)) {}

  // The bytes one block takes on the wire, every rank's together; 0 when this engine serves no
  // KV transfer (a device with no KV pools, or prefix caching off).
  [[nodiscard]] int64_t WireBytesPerBlock();
  // Engine::ExportPrefixChunks, ImportPrefix, StagePrefixForLink, StartSendStagedPrefix,
  // ReceivePrefixFromLink, CachedRun and AdoptPrefix (worker/engine.h says what each does).
  absl::Status ExportChunks(absl::Span<const int32_t> prompt, const std::string& cache_salt,
                            int first_block, int blocks_per_chunk,
                            const std::function<bool(PrefixChunk)>& each);
  absl::StatusOr<int> Import(absl::Span<const int32_t> prompt, const std::string& cache_salt,
                             absl::Span<const std::string> wires, int first_block);
  absl::StatusOr<PrefixChunk> StageForLink(absl::Span<const int32_t> prompt,
                                           const std::string& cache_salt, int first_block,
                                           int max_blocks);
  absl::Status StartSendStaged(PeerLinks links);
  absl::StatusOr<int> ReceiveFromLink(PeerLinks links, absl::Span<const int32_t> prompt,
                                      const std::string& cache_salt,
                                      absl::Span<const std::string> headers, int first_block);
  [[nodiscard]] int CachedRun(absl::Span<const BlockHash> hashes, int first_block) const;
  absl::StatusOr<int> Adopt(absl::Span<const int32_t> prompt, const std::string& cache_salt,
                            int first_block, int blocks);

  // That a chunk from `first_block` of a prompt hashed `all` may be cached here (in range, its
  // parent cached).
  absl::Status CheckChain(absl::Span<const BlockHash> all, int first_block) const;
  // `n` fresh device blocks for received KV (KvCacheManager::AllocateReceived), the spills
  // their allocation planned run first; ResourceExhausted when the pool has no room.
  absl::StatusOr<std::vector<int>> Allocate(int n);
  // Caches received blocks targets[i] (written) as prompt block first_block + i, chain tail
  // first, releasing those whose hash is cached already; returns those cached.
  int CacheWritten(absl::Span<const int32_t> prompt, absl::Span<const BlockHash> all,
                   int first_block, absl::Span<const int> targets);
  // Waits for every rank's backend to finish what was issued to it (between steps).
  void SynchronizeRanks();
  // The prompt's block hashes (the engine's hashing).
  absl::StatusOr<std::vector<BlockHash>> Hashes(absl::Span<const int32_t> prompt,
                                                const std::string& cache_salt) const {
    return hashes_(prompt, cache_salt);
  }

 private:
  // The device pool's blocks of hashes all[first_block...] up to the first not cached, at most
  // `max_blocks`; `more` when the cached run goes on.
  struct CachedChunk {
    std::vector<int> blocks;
    std::vector<BlockHash> hashes;
    bool more = false;
  };
  CachedChunk CachedBlocks(absl::Span<const BlockHash> all, size_t first_block,
                           int max_blocks) const;
  // Caches `count` blocks from `first_block`, `write` given (pool block, index from
  // first_block) of those not cached yet before they are cached.
  absl::StatusOr<int> CacheArrived(
      absl::Span<const int32_t> prompt, absl::Span<const BlockHash> all, int first_block, int count,
      const std::function<void(const std::vector<std::pair<int, size_t>>&)>& write);
  // Caches received block `block` (written) as prompt block `at`, or releases it when that
  // hash is cached already; returns whether it was cached.
  bool CacheBlock(absl::Span<const int32_t> prompt, absl::Span<const BlockHash> all, size_t at,
                  int block);
  // Rank `rank`'s ends of the transfer (made at first use): pinned staging on a device backend.
  KvStaging& Staging(int rank);

  ModelRunner* const runner_;
  KvCacheManager* const kv_;
  const int block_size_;
  const PromptHashes hashes_;
  // One per rank, each on the runner's pool and backend (the engine frees this part first).
  std::vector<std::unique_ptr<KvStaging>> staging_;
};

}  // namespace kvserve::worker

#endif  // KVSERVE_WORKER_PREFIX_TRANSFER_H_
