#include "router/prefix_index.h"

namespace kvserve::router {
namespace {

namespace pb = ::kvserve::v1;

uint8_t Bit(pb::Medium m) { return m == pb::MEDIUM_HOST ? 2 : 1; }

}  // namespace

PrefixIndex::Worker& PrefixIndex::Get(int w) { return workers_[w]; }

void PrefixIndex::Set(Worker& worker, const std::string& hash_bytes, pb::Medium medium, bool on) {
  absl::StatusOr<BlockHash> h = BlockHash::FromBytes(hash_bytes);
  if (!h.ok()) return;  // a malformed hash from the network is ignored
  if (on) {
    worker.blocks[*h] |= Bit(medium);
    return;
  }
  auto it = worker.blocks.find(*h);
  if (it == worker.blocks.end()) return;
  it->second &= static_cast<uint8_t>(~Bit(medium));
  if (it->second == 0) worker.blocks.erase(it);
}

PrefixIndex::Apply PrefixIndex::ApplyEvents(int w, const pb::KvEventBatch& batch) {
  Worker& worker = Get(w);
  if (batch.instance_id() != worker.instance_id) {
    // A new process: whatever we knew about the old one is gone. (The first instance we hear
    // from keeps the approximate entries our own routing recorded until its snapshot.) A
    // stream seen from its first batch is complete.
    if (worker.instance_id != 0) worker.blocks.clear();
    worker.instance_id = batch.instance_id();
    worker.seq = 0;
    worker.synced = batch.seq() == 1;
    if (!worker.synced) return Apply::kGap;
  } else if (batch.seq() <= worker.seq) {
    return Apply::kIgnored;
  } else if (!worker.synced || batch.seq() != worker.seq + 1) {
    worker.synced = false;
    return Apply::kGap;
  }
  for (const pb::KvEvent& e : batch.events()) {
    if (e.has_stored()) {
      for (const std::string& h : e.stored().block_hashes())
        Set(worker, h, e.stored().medium(), true);
    } else if (e.has_removed()) {
      for (const std::string& h : e.removed().block_hashes())
        Set(worker, h, e.removed().medium(), false);
    } else if (e.has_all_cleared()) {
      if (e.all_cleared().medium() == pb::MEDIUM_UNSPECIFIED) {
        worker.blocks.clear();
      } else {
        const uint8_t bit = Bit(e.all_cleared().medium());
        absl::erase_if(worker.blocks, [&](auto& kv) { return (kv.second &= ~bit) == 0; });
      }
    }
  }
  worker.seq = batch.seq();
  return Apply::kApplied;
}

void PrefixIndex::ApplySnapshot(int w, const pb::KvSnapshot& snapshot) {
  Worker& worker = Get(w);
  worker.instance_id = snapshot.instance_id();
  worker.seq = snapshot.seq();
  worker.synced = true;
  worker.blocks.clear();
  for (const pb::CachedBlock& b : snapshot.blocks()) Set(worker, b.block_hash(), b.medium(), true);
}

bool PrefixIndex::SeeInstance(int w, uint64_t instance_id) {
  Worker& worker = Get(w);
  if (worker.instance_id == 0 || instance_id == 0 || instance_id == worker.instance_id)
    return false;
  worker.blocks.clear();
  worker.instance_id = instance_id;
  worker.seq = 0;
  worker.synced = false;
  return true;
}

void PrefixIndex::RecordRouted(int w, absl::Span<const BlockHash> hashes) {
  Worker& worker = Get(w);
  for (const BlockHash& h : hashes) worker.blocks[h] |= 1;
}

void PrefixIndex::RemoveWorker(int w) { workers_.erase(w); }

PrefixIndex::Match PrefixIndex::LongestPrefix(int w, absl::Span<const BlockHash> hashes) const {
  Match m;
  auto it = workers_.find(w);
  if (it == workers_.end()) return m;
  for (const BlockHash& h : hashes) {
    auto b = it->second.blocks.find(h);
    if (b == it->second.blocks.end()) break;
    if (b->second & 1) {
      ++m.device_blocks;
    } else {
      ++m.host_blocks;
    }
  }
  return m;
}

bool PrefixIndex::synced(int w) const {
  auto it = workers_.find(w);
  return it != workers_.end() && it->second.synced;
}

size_t PrefixIndex::num_blocks(int w) const {
  auto it = workers_.find(w);
  return it == workers_.end() ? 0 : it->second.blocks.size();
}

uint64_t PrefixIndex::last_seq(int w) const {
  auto it = workers_.find(w);
  return it == workers_.end() ? 0 : it->second.seq;
}

}  // namespace kvserve::router
