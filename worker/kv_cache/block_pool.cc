#include "worker/kv_cache/block_pool.h"

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace kvserve::worker {

BlockPool::BlockPool(int num_blocks) : blocks_(num_blocks) {
  for (int b = 0; b < num_blocks; ++b) PushTail(b);
}

void BlockPool::PushHead(int b) {
  Block& blk = blocks_[b];
  blk.prev = -1;
  blk.next = head_;
  if (head_ >= 0) blocks_[head_].prev = b;
  head_ = b;
  if (tail_ < 0) tail_ = b;
  blk.in_free_queue = true;
  ++num_free_;
  if (blk.hash) ++num_cached_evictable_;
}

void BlockPool::PushTail(int b) {
  Block& blk = blocks_[b];
  blk.next = -1;
  blk.prev = tail_;
  if (tail_ >= 0) blocks_[tail_].next = b;
  tail_ = b;
  if (head_ < 0) head_ = b;
  blk.in_free_queue = true;
  ++num_free_;
  if (blk.hash) ++num_cached_evictable_;
}

void BlockPool::Unlink(int b) {
  Block& blk = blocks_[b];
  CHECK(blk.in_free_queue);
  if (blk.prev >= 0)
    blocks_[blk.prev].next = blk.next;
  else
    head_ = blk.next;
  if (blk.next >= 0)
    blocks_[blk.next].prev = blk.prev;
  else
    tail_ = blk.prev;
  blk.prev = blk.next = -1;
  blk.in_free_queue = false;
  --num_free_;
  if (blk.hash) --num_cached_evictable_;
}

void BlockPool::Evict(int b) {
  Block& blk = blocks_[b];
  if (!blk.hash) return;
  cached_.erase(*blk.hash);
  BlockHash h = *blk.hash;
  blk.hash.reset();
  ++num_evictions_;
  if (listener_) listener_(b, h, /*stored=*/false);
}

std::optional<int> BlockPool::Allocate() {
  if (head_ < 0) return std::nullopt;
  const int b = head_;
  Unlink(b);
  Evict(b);
  blocks_[b].ref_count = 1;
  return b;
}

void BlockPool::Touch(int b) {
  Block& blk = blocks_[b];
  if (blk.in_free_queue) {
    CHECK_EQ(blk.ref_count, 0);
    Unlink(b);
  }
  ++blk.ref_count;
}

void BlockPool::Release(int b) {
  Block& blk = blocks_[b];
  CHECK_GT(blk.ref_count, 0) << "block " << b << " released more often than referenced";
  if (--blk.ref_count > 0) return;
  if (blk.hash) {
    PushTail(b);
  } else {
    PushHead(b);
  }
}

bool BlockPool::Cache(int b, const BlockHash& hash) {
  Block& blk = blocks_[b];
  if (blk.hash || cached_.contains(hash)) return false;
  CHECK(!blk.in_free_queue) << "caching an unreferenced block " << b;
  blk.hash = hash;
  cached_.emplace(hash, b);
  if (listener_) listener_(b, hash, /*stored=*/true);
  return true;
}

std::optional<int> BlockPool::Lookup(const BlockHash& hash) const {
  auto it = cached_.find(hash);
  if (it == cached_.end()) return std::nullopt;
  return it->second;
}

absl::Status BlockPool::CheckInvariants(const std::vector<int>& expected_refs) const {
  if (expected_refs.size() != blocks_.size()) {
    return absl::InternalError("expected_refs has the wrong size");
  }
  int free_count = 0, evictable = 0;
  int prev = -1;
  for (int b = head_; b >= 0; b = blocks_[b].next) {
    if (++free_count > num_blocks()) return absl::InternalError("free queue has a cycle");
    const Block& blk = blocks_[b];
    if (!blk.in_free_queue)
      return absl::InternalError(absl::StrCat("block ", b, " linked but not marked free"));
    if (blk.prev != prev)
      return absl::InternalError(absl::StrCat("block ", b, " has a bad prev link"));
    if (blk.ref_count != 0) return absl::InternalError(absl::StrCat("free block ", b, " has refs"));
    if (blk.hash) ++evictable;
    prev = b;
  }
  if (prev != tail_) return absl::InternalError("free queue tail is wrong");
  if (free_count != num_free_) {
    return absl::InternalError(
        absl::StrCat("free queue holds ", free_count, ", counter says ", num_free_));
  }
  if (evictable != num_cached_evictable_) return absl::InternalError("evictable counter is wrong");
  for (int b = 0; b < num_blocks(); ++b) {
    const Block& blk = blocks_[b];
    if (blk.ref_count != expected_refs[b]) {
      return absl::InternalError(absl::StrCat("block ", b, " has ref count ", blk.ref_count,
                                              " but ", expected_refs[b], " owners"));
    }
    if ((blk.ref_count == 0) != blk.in_free_queue) {
      return absl::InternalError(absl::StrCat("block ", b, " free-queue membership is wrong"));
    }
    if (blk.hash) {
      auto it = cached_.find(*blk.hash);
      if (it == cached_.end() || it->second != b) {
        return absl::InternalError(absl::StrCat("block ", b, " hash is not mapped to it"));
      }
    }
  }
  for (const auto& [hash, b] : cached_) {
    if (!blocks_[b].hash || !(*blocks_[b].hash == hash)) {
      return absl::InternalError(absl::StrCat("hash map entry for block ", b, " is stale"));
    }
  }
  return absl::OkStatus();
}

}  // namespace kvserve::worker
