#include "worker/kv_cache/kv_cache_manager.h"

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace kvserve::worker {

KvCacheManager::KvCacheManager(int num_blocks, int block_size, bool enable_prefix_caching)
    : pool_(num_blocks), block_size_(block_size), enable_prefix_caching_(enable_prefix_caching) {}

std::vector<int> KvCacheManager::FindCachedBlocks(const Sequence& seq) const {
  std::vector<int> out;
  if (!enable_prefix_caching_) return out;
  const size_t limit = static_cast<size_t>((seq.num_tokens() - 1) / block_size_);
  for (size_t i = 0; i < seq.block_hashes.size() && i < limit; ++i) {
    std::optional<int> b = pool_.Lookup(seq.block_hashes[i]);
    if (!b) break;
    out.push_back(*b);
  }
  return out;
}

bool KvCacheManager::Allocate(Sequence& seq, int num_new_tokens, const std::vector<int>& cached,
                              std::vector<std::pair<int, int>>* copies) {
  CHECK(cached.empty() || seq.block_table.empty());
  const int computed = seq.num_computed_tokens + static_cast<int>(cached.size()) * block_size_;
  const int total = computed + num_new_tokens;
  const int have = static_cast<int>(seq.block_table.size() + cached.size());
  const int need_blocks = (total + block_size_ - 1) / block_size_;
  int fresh = std::max(0, need_blocks - have);
  // The block holding the first new token is written: it must not be shared.
  const int write_block = computed / block_size_;
  const bool cow = num_new_tokens > 0 && write_block < static_cast<int>(seq.block_table.size()) &&
                   pool_.ref_count(seq.block_table[write_block]) > 1;
  int cached_free = 0;  // cached hits that sit in the free queue and stop being free
  for (int b : cached) cached_free += pool_.ref_count(b) == 0 ? 1 : 0;
  if (fresh + (cow ? 1 : 0) > pool_.num_free() - cached_free) return false;

  for (int b : cached) {
    pool_.Touch(b);
    seq.block_table.push_back(b);
  }
  if (!cached.empty()) {
    seq.num_computed_tokens = computed;
    seq.num_cached_blocks = static_cast<int>(cached.size());
  }
  if (cow) {
    const int src = seq.block_table[write_block];
    const int dst = *pool_.Allocate();
    copies->emplace_back(src, dst);
    pool_.Release(src);
    seq.block_table[write_block] = dst;
  }
  for (int i = 0; i < fresh; ++i) seq.block_table.push_back(*pool_.Allocate());
  return true;
}

void KvCacheManager::CacheComputedBlocks(Sequence& seq) {
  if (!enable_prefix_caching_) return;
  const int full = std::min<int>(seq.num_computed_tokens / block_size_,
                                 static_cast<int>(seq.block_hashes.size()));
  for (int i = seq.num_cached_blocks; i < full; ++i) {
    const int b = seq.block_table[i];
    // A block that is already cached (shared through a fork) or whose hash another block
    // holds stays as it is; either way the prefix is findable.
    if (!pool_.hash(b)) pool_.Cache(b, seq.block_hashes[i]);
  }
  seq.num_cached_blocks = std::max(seq.num_cached_blocks, full);
}

void KvCacheManager::Free(Sequence& seq) {
  for (auto it = seq.block_table.rbegin(); it != seq.block_table.rend(); ++it) pool_.Release(*it);
  seq.block_table.clear();
  seq.num_cached_blocks = 0;
}

void KvCacheManager::Fork(const Sequence& parent, Sequence& child) {
  CHECK(child.block_table.empty());
  child.block_table = parent.block_table;
  for (int b : child.block_table) pool_.Touch(b);
  child.num_computed_tokens = parent.num_computed_tokens;
  child.num_cached_blocks = parent.num_cached_blocks;
}

absl::Status KvCacheManager::CheckInvariants(absl::Span<const Sequence* const> live) const {
  std::vector<int> refs(pool_.num_blocks(), 0);
  for (const Sequence* seq : live) {
    const int need = (seq->num_computed_tokens + block_size_ - 1) / block_size_;
    if (static_cast<int>(seq->block_table.size()) < need) {
      return absl::InternalError(absl::StrCat("seq ", seq->id, " has ", seq->block_table.size(),
                                              " blocks for ", seq->num_computed_tokens, " tokens"));
    }
    for (size_t i = 0; i < seq->block_table.size(); ++i) {
      const int b = seq->block_table[i];
      if (b < 0 || b >= pool_.num_blocks()) return absl::InternalError("block id out of range");
      ++refs[b];
      const auto& h = pool_.hash(b);
      if (h && i < seq->block_hashes.size() && static_cast<int>(i) < seq->num_cached_blocks &&
          !(*h == seq->block_hashes[i])) {
        return absl::InternalError(absl::StrCat("seq ", seq->id, " block ", i, " (", b,
                                                ") caches another prefix's hash"));
      }
    }
  }
  return pool_.CheckInvariants(refs);
}

}  // namespace kvserve::worker
