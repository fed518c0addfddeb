// Per-sequence block tables on top of two BlockPools, the device pool and an optional host
// pool (--swap-space): prefix-cache lookup across both tiers, slot allocation with
// copy-on-write for shared blocks, registering newly full blocks, forking for parallel
// sampling, swapping sequences out to host and back, spilling evicted prefix blocks to the host
// (--host-prefix-cache), freeing, and an invariant checker for tests.
//
// Data moves are only planned here; the engine runs them before the forward pass, in this
// order: device→host (swap-outs, spilled evictions), device→device (copy-on-write),
// host→device (swap-ins, host prefix hits), then calls FinishCopies() so the host blocks read
// by the last group can be reused.
//
//   std::vector<CachedBlock> hit = kv.FindCachedBlocks(seq);
//   if (!kv.Allocate(seq, num_new_tokens, hit)) { /* preempt someone */ }
//   BlockCopies copies = kv.TakeCopies();  ... run them ...  kv.FinishCopies();
//   ... forward pass ...;  kv.CacheComputedBlocks(seq);
//
// Owned by the engine thread; not thread-safe.
#ifndef KVSERVE_WORKER_KV_CACHE_KV_CACHE_MANAGER_H_
#define KVSERVE_WORKER_KV_CACHE_KV_CACHE_MANAGER_H_

#include <functional>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "worker/kv_cache/block_pool.h"
#include "worker/request/request.h"

namespace kvserve::worker {

enum class Medium { kDevice, kHost };

// What a cached block holds, for consumers that re-hash it (vLLM's BlockStored): its parent's
// hash (none for a sequence's first block) and its block_size tokens.
struct BlockContent {
  std::optional<BlockHash> parent;
  std::vector<int32_t> tokens;
};

// Receives every change to the set of cached blocks: a full block's hash registered in (stored)
// or dropped from (removed) one tier's prefix cache. Called on the engine thread, in order.
// `content` is the block's, valid during the call, when the manager keeps contents
// (KvPoolOptions::keep_block_contents); else null.
class KvEventListener {
 public:
  virtual ~KvEventListener() = default;
  virtual void OnKvEvent(const BlockHash& hash, bool stored, Medium medium,
                         const BlockContent* content) = 0;
};

struct CachedBlock {
  int block;
  Medium medium;
};

struct BlockCopies {
  std::vector<std::pair<int, int>> device_to_host;    // (device block, host block)
  std::vector<std::pair<int, int>> device_to_device;  // (src, dst)
  std::vector<std::pair<int, int>> host_to_device;    // (host block, device block)
  [[nodiscard]] bool empty() const {
    return device_to_host.empty() && device_to_device.empty() && host_to_device.empty();
  }
};

struct KvPoolOptions {
  int num_blocks = 0;
  int block_size = 16;
  bool enable_prefix_caching = true;
  int num_host_blocks = 0;         // 0: no host tier
  bool host_prefix_cache = false;  // spill evicted prefix blocks to the host tier
  // Keep each cached block's content for the event listener (block_size tokens and a hash
  // per cached block, freed when no tier caches it).
  bool keep_block_contents = false;
};

struct KvCacheCounters {
  int64_t swap_out_blocks = 0;
  int64_t swap_in_blocks = 0;
  int64_t device_hit_blocks = 0;
  int64_t host_hit_blocks = 0;
  int64_t host_spilled_blocks = 0;  // evicted device blocks saved to the host tier
};

class KvCacheManager {
 public:
  explicit KvCacheManager(const KvPoolOptions& options);

  // The seq's leading full blocks found in the prefix cache (device first, then host), keeping
  // at least one token to compute. Empty when prefix caching is off.
  [[nodiscard]] std::vector<CachedBlock> FindCachedBlocks(const Sequence& seq) const;

  // Makes room for `num_new_tokens` more computed tokens: takes `cached` blocks first (only
  // for a sequence with no blocks; host hits are copied into fresh device blocks), copies a
  // shared block about to be written, then allocates fresh blocks. Returns false and changes
  // nothing when the device pool cannot supply them.
  bool Allocate(Sequence& seq, int num_new_tokens, const std::vector<CachedBlock>& cached);

  // Registers the hashes of the seq's full, computed blocks that are not cached yet.
  void CacheComputedBlocks(Sequence& seq);

  // Releases every block (last first, so chain tails are evicted first) and clears the table.
  void Free(Sequence& seq);

  // Gives `child` the parent's blocks (shared, reference counted) and computed state.
  void Fork(const Sequence& parent, Sequence& child);

  // Swapping: a swapped-out sequence's table holds host block ids.
  [[nodiscard]] bool CanSwapOut(const Sequence& seq) const;
  void SwapOut(Sequence& seq);
  [[nodiscard]] bool CanSwapIn(const Sequence& seq, int extra_blocks) const;
  void SwapIn(Sequence& seq);

  // The copies planned since the last call, and the release of host blocks they read.
  BlockCopies TakeCopies();
  void FinishCopies();

  // KV transfer (docs/DISAGGREGATION.md): `n` fresh device blocks for blocks received from a
  // peer, or nullopt (nothing taken) when the pool cannot supply them. Their allocation may plan
  // spills of evicted blocks (TakeCopies): run those before writing the new blocks.
  std::optional<std::vector<int>> AllocateReceived(int n);
  // A received block, written, becomes cached under `hash` (`content` for the listener) and is
  // released: evictable like any cached block. Release the blocks of a chain last first.
  void CacheReceived(int block, const BlockHash& hash, const BlockContent& content);
  // Returns received blocks that will not be written (a failed transfer) to the pool.
  void ReleaseReceived(absl::Span<const int> blocks);
  // Layer streaming: keeps device blocks from being freed or reused while sends read them
  // (a reference each, counted by CheckInvariants), and lets them go.
  void Hold(absl::Span<const int> blocks);
  void Unhold(absl::Span<const int> blocks);

  // Every live block table against the pools: reference counts equal the number of tables
  // holding each block (host tables for swapped sequences), tables are long enough, cached
  // blocks match their sequence's hashes.
  absl::Status CheckInvariants(absl::Span<const Sequence* const> live) const;

  // `listener` (null: none) must outlive this manager or the next call. `contents`: pass each
  // block's content with its events (before any block is cached).
  void set_event_listener(KvEventListener* listener, bool contents = false) {
    listener_ = listener;
    options_.keep_block_contents = contents;
  }

  [[nodiscard]] const BlockPool& pool() const { return device_; }
  [[nodiscard]] const BlockPool* host_pool() const { return host_ ? &*host_ : nullptr; }
  [[nodiscard]] int block_size() const { return options_.block_size; }
  [[nodiscard]] bool prefix_caching() const { return options_.enable_prefix_caching; }
  [[nodiscard]] const KvCacheCounters& counters() const { return counters_; }

 private:
  void OnDeviceCacheChange(int block, const BlockHash& hash, bool stored);
  void OnHostCacheChange(const BlockHash& hash, bool stored);
  // Block i of `seq` is about to be cached: keeps its content (keep_block_contents).
  void RememberContent(const Sequence& seq, int i);
  // Tells the listener; keeps the content's record of which tiers cache the block.
  void Notify(const BlockHash& hash, bool stored, Medium medium);
  // Frees the content of a block that no tier caches.
  void ForgetIfUncached(const BlockHash& hash);

  struct KeptContent {
    BlockContent content;
    bool on_device = false, on_host = false;
  };

  KvPoolOptions options_;
  BlockPool device_;
  std::optional<BlockPool> host_;
  BlockCopies pending_;
  std::vector<int> host_releases_;  // host blocks to release after the pending copies ran
  // Device blocks held outside any table: received ones not cached yet, and streamed ones
  // whose sends may be in flight (one entry per reference).
  std::vector<int> held_;
  KvCacheCounters counters_;
  KvEventListener* listener_ = nullptr;
  absl::flat_hash_map<BlockHash, KeptContent> contents_;  // keep_block_contents only
};

}  // namespace kvserve::worker

#endif  // KVSERVE_WORKER_KV_CACHE_KV_CACHE_MANAGER_H_
