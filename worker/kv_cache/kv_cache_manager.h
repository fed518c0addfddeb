// Per-sequence block tables on top of the BlockPool: prefix-cache lookup, slot allocation
// with copy-on-write for shared blocks, registering newly full blocks, forking for parallel
// sampling, freeing, and an invariant checker for tests.
//
//   std::vector<int> hit = kv.FindCachedBlocks(seq);          // leading cached blocks
//   std::vector<std::pair<int, int>> copies;                  // (src, dst) block copies
//   if (!kv.Allocate(seq, num_new_tokens, hit, &copies)) { /* preempt someone */ }
//   ... run the model, then: kv.CacheComputedBlocks(seq);
//
// Owned by the engine thread; not thread-safe.
#ifndef KVSERVE_WORKER_KV_CACHE_KV_CACHE_MANAGER_H_
#define KVSERVE_WORKER_KV_CACHE_KV_CACHE_MANAGER_H_

#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "worker/kv_cache/block_pool.h"
#include "worker/request.h"

namespace kvserve::worker {

class KvCacheManager {
 public:
  KvCacheManager(int num_blocks, int block_size, bool enable_prefix_caching);

  // The seq's leading full blocks found in the prefix cache, keeping at least one token to
  // compute (its logits are needed). Empty when prefix caching is off.
  [[nodiscard]] std::vector<int> FindCachedBlocks(const Sequence& seq) const;

  // Makes room for `num_new_tokens` more computed tokens: takes `cached` blocks first (only
  // for a sequence with no blocks yet), copies a shared block that is about to be written
  // (appending the (src, dst) pair to `copies`), then allocates fresh blocks. Returns false and
  // changes nothing when the pool cannot supply them.
  bool Allocate(Sequence& seq, int num_new_tokens, const std::vector<int>& cached,
                std::vector<std::pair<int, int>>* copies);

  // Registers the hashes of the seq's full, computed blocks that are not cached yet.
  void CacheComputedBlocks(Sequence& seq);

  // Releases every block (last first, so chain tails are evicted first) and clears the table.
  void Free(Sequence& seq);

  // Gives `child` the parent's blocks (shared, reference counted) and computed state.
  void Fork(const Sequence& parent, Sequence& child);

  // Every live block table against the pool: reference counts equal the number of tables
  // holding each block, tables are long enough for the computed tokens, cached blocks match
  // their sequence's hashes.
  absl::Status CheckInvariants(absl::Span<const Sequence* const> live) const;

  [[nodiscard]] const BlockPool& pool() const { return pool_; }
  [[nodiscard]] BlockPool& pool() { return pool_; }
  [[nodiscard]] int block_size() const { return block_size_; }
  [[nodiscard]] bool prefix_caching() const { return enable_prefix_caching_; }

 private:
  BlockPool pool_;
  int block_size_;
  bool enable_prefix_caching_;
};

}  // namespace kvserve::worker

#endif  // KVSERVE_WORKER_KV_CACHE_KV_CACHE_MANAGER_H_
