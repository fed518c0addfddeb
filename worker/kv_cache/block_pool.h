// The physical KV block pool's bookkeeping: reference counts, the hash → block map of cached
// full blocks, and one free queue that holds never-used blocks and cached-but-unreferenced
// blocks in eviction order. Plain host data, no tensors: the pool's memory lives in the model
// runner; block ids index it on every rank.
//
// Eviction: a block whose reference count drops to zero goes to the tail of the free queue if
// it holds a cached hash (so it can still be hit) and to the head if not (nothing to lose).
// Allocation pops the head; popping a cached block evicts its hash. Callers release a
// sequence's blocks last-first, so the tail of a prefix chain is evicted before its head.
//
//   BlockPool pool(1024);
//   std::optional<int> b = pool.Allocate();      // ref 1
//   pool.Cache(*b, hash);  pool.Release(*b);     // cached, evictable
//   std::optional<int> hit = pool.Lookup(hash);  // then pool.Touch(*hit)
//
// Owned by the engine thread; not thread-safe.
#ifndef KVSERVE_WORKER_KV_CACHE_BLOCK_POOL_H_
#define KVSERVE_WORKER_KV_CACHE_BLOCK_POOL_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "common/kv/block_hash.h"

namespace kvserve::worker {

class BlockPool {
 public:
  // Called when a block's hash enters (stored = true) or leaves the cache (eviction, just
  // before the block is handed out again); KV events and the host prefix cache hang off this.
  using CacheListener = std::function<void(int block, const BlockHash& hash, bool stored)>;

  explicit BlockPool(int num_blocks);

  // A free block with reference count 1, evicting its cached hash if it had one; nullopt when
  // every block is referenced.
  std::optional<int> Allocate();
  // Adds a reference; a block taken from the free queue leaves it (a prefix-cache hit).
  void Touch(int block);
  // Drops a reference; at zero the block joins the free queue (tail if cached, else head).
  void Release(int block);
  // Registers a full block's hash. Returns false (and changes nothing) if another block
  // already caches that hash or the block is cached already.
  bool Cache(int block, const BlockHash& hash);
  // The block caching `hash`, if any.
  [[nodiscard]] std::optional<int> Lookup(const BlockHash& hash) const;

  void set_listener(CacheListener listener) { listener_ = std::move(listener); }

  [[nodiscard]] int num_blocks() const { return static_cast<int>(blocks_.size()); }
  // Blocks that Allocate can hand out (never used + cached evictable).
  [[nodiscard]] int num_free() const { return num_free_; }
  [[nodiscard]] int num_cached() const { return static_cast<int>(cached_.size()); }
  // Cached blocks with no reference (evictable).
  [[nodiscard]] int num_cached_evictable() const { return num_cached_evictable_; }
  [[nodiscard]] int ref_count(int block) const { return blocks_[block].ref_count; }
  [[nodiscard]] const std::optional<BlockHash>& hash(int block) const {
    return blocks_[block].hash;
  }
  [[nodiscard]] int64_t num_evictions() const { return num_evictions_; }

  // Calls fn for every cached hash (any order).
  void ForEachCached(const std::function<void(const BlockHash&)>& fn) const {
    for (const auto& [hash, block] : cached_) fn(hash);
  }

  // Internal consistency: the free queue holds exactly the unreferenced blocks, links are
  // symmetric, the hash map and the blocks' hashes agree, counters match. `expected_refs`
  // (size num_blocks) gives each block's reference count as the owners see it.
  absl::Status CheckInvariants(const std::vector<int>& expected_refs) const;

 private:
  struct Block {
    int ref_count = 0;
    std::optional<BlockHash> hash;
    int prev = -1, next = -1;  // free-queue links
    bool in_free_queue = false;
  };
  void PushHead(int block);
  void PushTail(int block);
  void Unlink(int block);
  void Evict(int block);

  std::vector<Block> blocks_;
  int head_ = -1, tail_ = -1;
  int num_free_ = 0;
  int num_cached_evictable_ = 0;
  int64_t num_evictions_ = 0;
  absl::flat_hash_map<BlockHash, int> cached_;
  CacheListener listener_;
};

}  // namespace kvserve::worker

#endif  // KVSERVE_WORKER_KV_CACHE_BLOCK_POOL_H_
