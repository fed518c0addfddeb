#include "worker/kv_cache/kv_cache_manager.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace kvserve::worker {

KvCacheManager::KvCacheManager(const KvPoolOptions& options)
    : options_(options), device_(options.num_blocks) {
  device_.set_listener([this](int block, const BlockHash& hash, bool stored) {
    OnDeviceCacheChange(block, hash, stored);
  });
  if (options.num_host_blocks > 0) {
    host_.emplace(options.num_host_blocks);
    host_->set_listener(
        [this](int, const BlockHash& hash, bool stored) { OnHostCacheChange(hash, stored); });
  }
}

void KvCacheManager::Notify(const BlockHash& hash, bool stored, Medium medium) {
  const BlockContent* content = nullptr;
  if (auto it = contents_.find(hash); it != contents_.end()) {
    (medium == Medium::kDevice ? it->second.on_device : it->second.on_host) = stored;
    content = &it->second.content;
  }
  if (listener_ != nullptr) listener_->OnKvEvent(hash, stored, medium, content);
}

void KvCacheManager::ForgetIfUncached(const BlockHash& hash) {
  auto it = contents_.find(hash);
  if (it != contents_.end() && !it->second.on_device && !it->second.on_host) contents_.erase(it);
}

void KvCacheManager::RememberContent(const Sequence& seq, int i) {
  if (!options_.keep_block_contents) return;
  auto [it, fresh] = contents_.try_emplace(seq.block_hashes[i]);
  if (!fresh) return;  // the same hash is the same content
  if (i > 0) it->second.content.parent = seq.block_hashes[i - 1];
  const int bs = options_.block_size;
  it->second.content.tokens.assign(seq.tokens.begin() + int64_t{i} * bs,
                                   seq.tokens.begin() + int64_t{i + 1} * bs);
}

void KvCacheManager::OnHostCacheChange(const BlockHash& hash, bool stored) {
  Notify(hash, stored, Medium::kHost);
  if (!stored) ForgetIfUncached(hash);
}

void KvCacheManager::OnDeviceCacheChange(int block, const BlockHash& hash, bool stored) {
  Notify(hash, stored, Medium::kDevice);
  if (!stored && host_ && options_.host_prefix_cache && !host_->Lookup(hash)) {
    // An evicted prefix block moves to the host tier (its LRU evicts in turn) instead of
    // being lost; the copy runs before anything overwrites the device block.
    if (std::optional<int> h = host_->Allocate()) {  // none: every host block is held
      pending_.device_to_host.emplace_back(block, *h);
      host_->Cache(*h, hash);
      host_->Release(*h);
      ++counters_.host_spilled_blocks;
    }
  }
  if (!stored) ForgetIfUncached(hash);
}

std::vector<CachedBlock> KvCacheManager::FindCachedBlocks(const Sequence& seq) const {
  std::vector<CachedBlock> out;
  if (!options_.enable_prefix_caching) return out;
  const size_t limit = static_cast<size_t>((seq.num_tokens() - 1) / options_.block_size);
  for (size_t i = 0; i < seq.block_hashes.size() && i < limit; ++i) {
    if (std::optional<int> b = device_.Lookup(seq.block_hashes[i])) {
      out.push_back({*b, Medium::kDevice});
    } else if (std::optional<int> h = host_ ? host_->Lookup(seq.block_hashes[i]) : std::nullopt) {
      out.push_back({*h, Medium::kHost});
    } else {
      break;
    }
  }
  return out;
}

bool KvCacheManager::Allocate(Sequence& seq, int num_new_tokens,
                              const std::vector<CachedBlock>& cached) {
  CHECK(cached.empty() || seq.block_table.empty());
  const int bs = options_.block_size;
  const int computed = seq.num_computed_tokens + static_cast<int>(cached.size()) * bs;
  const int need_blocks = (computed + num_new_tokens + bs - 1) / bs;
  const int have = static_cast<int>(seq.block_table.size() + cached.size());
  const int fresh = std::max(0, need_blocks - have);
  // The block holding the first new token is written: it must not be shared.
  const int write_block = computed / bs;
  const bool cow = num_new_tokens > 0 && write_block < static_cast<int>(seq.block_table.size()) &&
                   device_.ref_count(seq.block_table[write_block]) > 1;
  int device_free_hits = 0, host_hits = 0;
  for (const CachedBlock& c : cached) {
    if (c.medium == Medium::kHost) {
      ++host_hits;
    } else if (device_.ref_count(c.block) == 0) {
      ++device_free_hits;  // sits in the free queue and stops being free
    }
  }
  if (fresh + host_hits + (cow ? 1 : 0) > device_.num_free() - device_free_hits) return false;

  // Pin every hit first, so that no allocation below (whose evictions may spill to the host
  // tier and evict there in turn) can take one of them.
  for (const CachedBlock& c : cached) {
    (c.medium == Medium::kDevice ? device_ : *host_).Touch(c.block);
  }
  for (const CachedBlock& c : cached) {
    if (c.medium == Medium::kDevice) {
      seq.block_table.push_back(c.block);
      ++counters_.device_hit_blocks;
      continue;
    }
    host_releases_.push_back(c.block);  // held until the copy ran
    const int d = *device_.Allocate();
    pending_.host_to_device.emplace_back(c.block, d);
    RememberContent(seq, static_cast<int>(seq.block_table.size()));
    device_.Cache(d, *host_->hash(c.block));
    seq.block_table.push_back(d);
    ++counters_.host_hit_blocks;
  }
  if (!cached.empty()) {
    seq.num_computed_tokens = computed;
    seq.num_cached_blocks = static_cast<int>(cached.size());
  }
  if (cow) {
    const int src = seq.block_table[write_block];
    const int dst = *device_.Allocate();
    pending_.device_to_device.emplace_back(src, dst);
    device_.Release(src);
    seq.block_table[write_block] = dst;
  }
  for (int i = 0; i < fresh; ++i) seq.block_table.push_back(*device_.Allocate());
  return true;
}

void KvCacheManager::CacheComputedBlocks(Sequence& seq) {
  if (!options_.enable_prefix_caching) return;
  const int full = std::min<int>(seq.num_computed_tokens / options_.block_size,
                                 static_cast<int>(seq.block_hashes.size()));
  for (int i = seq.num_cached_blocks; i < full; ++i) {
    const int b = seq.block_table[i];
    // A block that is already cached (shared through a fork) or whose hash another block
    // holds stays as it is; either way the prefix is findable.
    if (!device_.hash(b)) {
      RememberContent(seq, i);
      device_.Cache(b, seq.block_hashes[i]);
      ForgetIfUncached(seq.block_hashes[i]);  // another block held the hash: nothing cached
    }
  }
  seq.num_cached_blocks = std::max(seq.num_cached_blocks, full);
}

void KvCacheManager::Free(Sequence& seq) {
  BlockPool& pool = seq.status == SeqStatus::kSwapped ? *host_ : device_;
  for (auto it = seq.block_table.rbegin(); it != seq.block_table.rend(); ++it) pool.Release(*it);
  seq.block_table.clear();
  seq.num_cached_blocks = 0;
}

void KvCacheManager::Fork(const Sequence& parent, Sequence& child) {
  CHECK(child.block_table.empty());
  child.block_table = parent.block_table;
  for (int b : child.block_table) device_.Touch(b);
  child.num_computed_tokens = parent.num_computed_tokens;
  child.num_cached_blocks = parent.num_cached_blocks;
}

bool KvCacheManager::CanSwapOut(const Sequence& seq) const {
  return host_ && host_->num_free() >= static_cast<int>(seq.block_table.size());
}

void KvCacheManager::SwapOut(Sequence& seq) {
  std::vector<int> host_table;
  for (int b : seq.block_table) {
    const int h = *host_->Allocate();
    pending_.device_to_host.emplace_back(b, h);
    host_table.push_back(h);
  }
  for (auto it = seq.block_table.rbegin(); it != seq.block_table.rend(); ++it) device_.Release(*it);
  counters_.swap_out_blocks += static_cast<int64_t>(host_table.size());
  seq.block_table = std::move(host_table);
  seq.num_cached_blocks = 0;
  seq.status = SeqStatus::kSwapped;
}

bool KvCacheManager::CanSwapIn(const Sequence& seq, int extra_blocks) const {
  return device_.num_free() >= static_cast<int>(seq.block_table.size()) + extra_blocks;
}

void KvCacheManager::SwapIn(Sequence& seq) {
  std::vector<int> device_table;
  for (int h : seq.block_table) {
    const int d = *device_.Allocate();
    pending_.host_to_device.emplace_back(h, d);
    host_releases_.push_back(h);  // its reference now belongs to the pending copy
    device_table.push_back(d);
  }
  counters_.swap_in_blocks += static_cast<int64_t>(device_table.size());
  seq.block_table = std::move(device_table);
  seq.status = SeqStatus::kRunning;
}

BlockCopies KvCacheManager::TakeCopies() { return std::exchange(pending_, BlockCopies{}); }

void KvCacheManager::FinishCopies() {
  for (int h : host_releases_) host_->Release(h);
  host_releases_.clear();
}

absl::Status KvCacheManager::CheckInvariants(absl::Span<const Sequence* const> live) const {
  std::vector<int> refs(device_.num_blocks(), 0);
  std::vector<int> host_refs(host_ ? host_->num_blocks() : 0, 0);
  for (int h : host_releases_) ++host_refs[h];
  for (int b : held_) ++refs[b];
  for (const Sequence* seq : live) {
    const bool swapped = seq->status == SeqStatus::kSwapped;
    const BlockPool& pool = swapped ? *host_ : device_;
    std::vector<int>& counts = swapped ? host_refs : refs;
    const int need = (seq->num_computed_tokens + options_.block_size - 1) / options_.block_size;
    if (static_cast<int>(seq->block_table.size()) < need) {
      return absl::InternalError(absl::StrCat("seq ", seq->id, " has ", seq->block_table.size(),
                                              " blocks for ", seq->num_computed_tokens, " tokens"));
    }
    for (size_t i = 0; i < seq->block_table.size(); ++i) {
      const int b = seq->block_table[i];
      if (b < 0 || b >= pool.num_blocks()) return absl::InternalError("block id out of range");
      ++counts[b];
      const auto& h = pool.hash(b);
      if (!swapped && h && i < seq->block_hashes.size() &&
          static_cast<int>(i) < seq->num_cached_blocks && !(*h == seq->block_hashes[i])) {
        return absl::InternalError(
            absl::StrCat("seq ", seq->id, " block ", i, " (", b, ") caches another prefix's hash"));
      }
    }
  }
  absl::Status s = device_.CheckInvariants(refs);
  if (!s.ok() || !host_) return s;
  s = host_->CheckInvariants(host_refs);
  if (!s.ok()) return absl::InternalError(absl::StrCat("host pool: ", s.message()));
  return absl::OkStatus();
}

std::optional<std::vector<int>> KvCacheManager::AllocateReceived(int n) {
  if (device_.num_free() < n) return std::nullopt;
  std::vector<int> out;
  for (int i = 0; i < n; ++i) out.push_back(*device_.Allocate());
  held_.insert(held_.end(), out.begin(), out.end());
  return out;
}

void KvCacheManager::Hold(absl::Span<const int> blocks) {
  for (int b : blocks) device_.Touch(b);
  held_.insert(held_.end(), blocks.begin(), blocks.end());
}

void KvCacheManager::Unhold(absl::Span<const int> blocks) {
  for (int b : blocks) {
    auto it = std::find(held_.begin(), held_.end(), b);
    CHECK(it != held_.end()) << "block " << b << " is not held";
    held_.erase(it);
    device_.Release(b);
  }
}

void KvCacheManager::CacheReceived(int block, const BlockHash& hash, const BlockContent& content) {
  if (options_.enable_prefix_caching) {
    if (options_.keep_block_contents) contents_.try_emplace(hash, KeptContent{content});
    device_.Cache(block, hash);
    ForgetIfUncached(hash);  // another block held the hash: nothing cached
  }
  Unhold({block});
}

void KvCacheManager::ReleaseReceived(absl::Span<const int> blocks) { Unhold(blocks); }

}  // namespace kvserve::worker
