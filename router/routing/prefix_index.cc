#include "router/routing/prefix_index.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"

namespace kvserve::router {
namespace {

namespace pb = ::kvserve::v1;

uint8_t Bit(pb::Medium m) { return m == pb::MEDIUM_HOST ? 2 : 1; }

// Approximate entries of a worker whose pool size is not known yet.
constexpr size_t kDefaultRoutedCap = 1 << 16;

// A worker's table is sized for its pool (up to this many entries) before it stores.
constexpr size_t kMaxReservedBlocks = 1 << 17;

// How many entries ahead FetchAhead fetches.
constexpr size_t kAhead = 8;

// A prompt held by at most this many workers is looked up on those alone, each found in the
// asked list by a scan; past it, every asked worker is looked up.
constexpr size_t kFewHolders = 8;

// Roots are tracked only for placements over at least this many workers: below, asking each
// worker costs less than the lookup every stored block would pay to keep the lists (a 14K-id
// prompt stores ~900 blocks a request on its worker).
constexpr size_t kTrackFromWorkers = 32;

// visit(i) for each i in [0, n), with fetch(i + kAhead) called first. In a fleet's index the
// entries a run of hashes touches are out of cache (0.25-0.6 us an event at 256 workers,
// prefix_index_bench's BM_ParseAndApplyFleet): fetching each entry's slot a few entries before
// it is used overlaps the misses (2.1-4.2x the events a second there; docs/ROUTING.md).
template <typename Fetch, typename Visit>
void FetchAhead(size_t n, Fetch fetch, Visit visit) {
  for (size_t i = 0; i < std::min(kAhead, n); ++i) fetch(i);
  for (size_t i = 0; i < n; ++i) {
    if (i + kAhead < n) fetch(i + kAhead);
    visit(i);
  }
}

}  // namespace

PrefixIndex::Worker& PrefixIndex::Get(int w) {
  auto [it, added] = workers_.try_emplace(w);
  if (added) it->second.id = w;
  return it->second;
}

void PrefixIndex::Clear(Worker& worker) {
  for (const BlockHash& root : worker.roots) Unlist(worker.id, root);
  worker.roots.clear();
  worker.blocks.clear();
  worker.routed.clear();
  worker.routed_order.clear();
}

void PrefixIndex::Gained(const Worker& worker, const BlockHash& h) const {
  if (holders_.empty()) return;
  auto it = holders_.find(h);
  if (it != holders_.end() && worker.roots.insert(h).second) it->second.push_back(worker.id);
}

void PrefixIndex::Lost(const Worker& worker, const BlockHash& h) const {
  if (worker.roots.empty() || worker.roots.erase(h) == 0) return;
  Unlist(worker.id, h);
}

void PrefixIndex::Unlist(int w, const BlockHash& root) const {
  auto it = holders_.find(root);
  it->second.erase(std::find(it->second.begin(), it->second.end(), w));
  if (it->second.empty()) holders_.erase(it);
}

const absl::InlinedVector<int, 2>& PrefixIndex::Holders(const BlockHash& root) const {
  if (auto it = holders_.find(root); it != holders_.end()) return it->second;
  if (holders_.size() >= kMaxTrackedRoots) {  // bounded: forget them all
    for (const auto& [w, worker] : workers_) worker.roots.clear();
    holders_.clear();
  }
  std::vector<const Worker*> all;
  all.reserve(workers_.size());
  for (const auto& [w, worker] : workers_) all.push_back(&worker);
  absl::InlinedVector<int, 2> found;
  FetchAhead(
      all.size(),
      [&](size_t i) {
        all[i]->blocks.prefetch(root);
        if (!all[i]->routed.empty()) all[i]->routed.prefetch(root);
      },
      [&](size_t i) {
        if (!all[i]->blocks.contains(root) && !all[i]->routed.contains(root)) return;
        found.push_back(all[i]->id);
        all[i]->roots.insert(root);
      });
  return holders_.emplace(root, std::move(found)).first->second;
}

std::optional<std::vector<int>> PrefixIndex::TrackedHolders(const BlockHash& root) const {
  auto it = holders_.find(root);
  if (it == holders_.end()) return std::nullopt;
  std::vector<int> out(it->second.begin(), it->second.end());
  std::sort(out.begin(), out.end());
  return out;
}

void PrefixIndex::RelistRoots(const Worker& worker) {
  if (holders_.empty()) return;
  const auto list = [&](const BlockHash& root, absl::InlinedVector<int, 2>& holders) {
    holders.push_back(worker.id);
    worker.roots.insert(root);
  };
  // Whichever side is smaller is walked: a restarted router's rebuild tracks no root yet.
  if (holders_.size() <= worker.blocks.size()) {
    for (auto& [root, holders] : holders_) {
      if (worker.blocks.contains(root)) list(root, holders);
    }
    return;
  }
  for (const auto& [h, tiers] : worker.blocks) {
    if (auto it = holders_.find(h); it != holders_.end()) list(h, it->second);
  }
}

bool PrefixIndex::PopOldestRouted(Worker& worker) {
  const auto [when, h] = worker.routed_order.front();
  worker.routed_order.pop_front();
  auto it = worker.routed.find(h);
  if (it == worker.routed.end() || it->second != when) return false;  // a stale order entry
  worker.routed.erase(it);
  Lost(worker, h);  // an assumed entry is never also a confirmed one
  return true;
}

bool PrefixIndex::OverCapacity(Worker& worker) {
  if (worker.capacity == 0 || worker.blocks.size() <= worker.capacity) return false;
  worker.evictions += static_cast<int64_t>(worker.blocks.size() + worker.routed.size());
  Clear(worker);
  worker.synced = false;
  return true;
}

void PrefixIndex::Set(Worker& worker, const BlockHash& h, pb::Medium medium, bool on) {
  if (on) {
    auto [it, added] = worker.blocks.try_emplace(h, 0);
    it->second |= Bit(medium);
    // Confirmed (its routed_order entry goes stale): it was held already.
    const bool was_routed = !worker.routed.empty() && worker.routed.erase(h) > 0;
    if (added && !was_routed) Gained(worker, h);
    return;
  }
  auto it = worker.blocks.find(h);
  if (it == worker.blocks.end()) return;
  it->second &= static_cast<uint8_t>(~Bit(medium));
  if (it->second == 0) {
    worker.blocks.erase(it);
    Lost(worker, h);
  }
}

void PrefixIndex::SetRun(Worker& worker, const google::protobuf::RepeatedPtrField<std::string>& run,
                         pb::Medium medium, bool on) {
  // Decoded first (decoding each hash as its entry was fetched lost most of the gain), on the
  // stack for a run of up to 64 (an allocation per event cost 0.8x the events a second in a
  // table in cache).
  absl::InlinedVector<BlockHash, 64> hashes;
  hashes.reserve(run.size());
  for (const std::string& bytes : run) {
    absl::StatusOr<BlockHash> h = BlockHash::FromBytes(bytes);
    if (h.ok()) hashes.push_back(*h);  // a malformed hash from the network is ignored
  }
  const bool confirms = on && !worker.routed.empty();
  // Grown by doubling as a worker's cache filled, the table moved every entry at each growth
  // (with the page faults of its new memory, ~15% of the router's samples over the 14K-id
  // trace's first minutes). Sized for the pool once, the index fills 1.15-1.25x faster
  // (prefix_index_bench's BM_FillFromEmpty; docs/ROUTING.md). Only while its slots (7/8 of
  // them usable) are fewer: reserve() itself also rehashes a table whose erased slots eat into
  // its room, sooner than the table would.
  if (const size_t want = std::min(worker.capacity, kMaxReservedBlocks);
      on && worker.blocks.bucket_count() - worker.blocks.bucket_count() / 8 < want) {
    worker.blocks.reserve(want);
  }
  FetchAhead(
      hashes.size(),
      [&](size_t i) {
        worker.blocks.prefetch(hashes[i]);
        if (confirms) worker.routed.prefetch(hashes[i]);
        if (on && !holders_.empty()) holders_.prefetch(hashes[i]);
      },
      [&](size_t i) { Set(worker, hashes[i], medium, on); });
}

PrefixIndex::Apply PrefixIndex::ApplyEvents(int w, const pb::KvEventBatch& batch) {
  Worker& worker = Get(w);
  if (batch.instance_id() != worker.instance_id) {
    // A new process: whatever we knew about the old one is gone. (The first instance we hear
    // from keeps the approximate entries our own routing recorded until its snapshot.) A
    // stream seen from its first batch is complete.
    const bool first_heard = worker.instance_id == 0;
    if (!first_heard) Clear(worker);
    worker.instance_id = batch.instance_id();
    worker.seq = 0;
    worker.synced = batch.seq() == 1;
    if (!worker.synced) return first_heard ? Apply::kJoined : Apply::kGap;
  } else if (batch.seq() <= worker.seq) {
    return Apply::kIgnored;
  } else if (!worker.synced) {
    return Apply::kAwaitingSnapshot;
  } else if (batch.seq() != worker.seq + 1) {
    worker.synced = false;
    return Apply::kGap;
  }
  for (const pb::KvEvent& e : batch.events()) {
    if (e.has_stored()) {
      SetRun(worker, e.stored().block_hashes(), e.stored().medium(), true);
    } else if (e.has_removed()) {
      SetRun(worker, e.removed().block_hashes(), e.removed().medium(), false);
    } else if (e.has_all_cleared()) {
      if (e.all_cleared().medium() == pb::MEDIUM_UNSPECIFIED) {
        Clear(worker);
      } else {
        const uint8_t bit = Bit(e.all_cleared().medium());
        absl::erase_if(worker.blocks, [&](auto& kv) {
          if ((kv.second &= ~bit) != 0) return false;
          Lost(worker, kv.first);
          return true;
        });
        if (e.all_cleared().medium() == pb::MEDIUM_DEVICE) {  // what was assumed is device
          for (const auto& [h, when] : worker.routed) Lost(worker, h);
          worker.routed.clear();
          worker.routed_order.clear();
        }
      }
    }
  }
  if (OverCapacity(worker)) return Apply::kGap;
  worker.seq = batch.seq();
  return Apply::kApplied;
}

void PrefixIndex::ApplySnapshot(int w, const pb::KvSnapshot& snapshot) {
  InstallSnapshot(w, BuildTable(snapshot, capacity(w)));
}

PrefixIndex::Table PrefixIndex::BuildTable(const pb::KvSnapshot& snapshot, size_t capacity) {
  Table table;
  table.instance_id = snapshot.instance_id();
  table.seq = snapshot.seq();
  // A rebuild is bound by the table's cache misses (two per new entry, at 100K entries a
  // worker): the hashes are decoded first, the table sized once, and each insert's slot fetched
  // ahead.
  std::vector<std::pair<BlockHash, uint8_t>> blocks;
  blocks.reserve(snapshot.blocks_size());
  for (const pb::CachedBlock& b : snapshot.blocks()) {
    absl::StatusOr<BlockHash> h = BlockHash::FromBytes(b.block_hash());
    if (h.ok()) blocks.emplace_back(*h, Bit(b.medium()));  // a malformed hash is ignored
  }
  const size_t limit = capacity > 0 ? capacity : blocks.size();
  // Room for the pool too (as SetRun gives it), so the events after the snapshot do not grow
  // the table on the core's thread.
  table.blocks.reserve(
      std::max(std::min(limit, blocks.size()), std::min(capacity, kMaxReservedBlocks)));
  FetchAhead(
      blocks.size(), [&](size_t i) { table.blocks.prefetch(blocks[i].first); },
      [&](size_t i) {
        if (table.blocks.size() >= limit) {
          ++table.evictions;  // more than the pool holds: the rest is not believed
          return;
        }
        table.blocks[blocks[i].first] |= blocks[i].second;
      });
  return table;
}

void PrefixIndex::InstallSnapshot(int w, Table table) {
  Worker& worker = Get(w);
  worker.instance_id = table.instance_id;
  worker.seq = table.seq;
  worker.synced = true;
  Clear(worker);  // no routed entry is left to confirm
  worker.blocks = std::move(table.blocks);
  worker.evictions += table.evictions;
  // Built against a larger pool than the worker now reports: the excess is not believed.
  while (worker.capacity > 0 && worker.blocks.size() > worker.capacity) {
    worker.blocks.erase(worker.blocks.begin());
    ++worker.evictions;
  }
  RelistRoots(worker);
}

bool PrefixIndex::SeeInstance(int w, uint64_t instance_id) {
  Worker& worker = Get(w);
  if (worker.instance_id == 0 || instance_id == 0 || instance_id == worker.instance_id)
    return false;
  Clear(worker);
  worker.instance_id = instance_id;
  worker.seq = 0;
  worker.synced = false;
  return true;
}

void PrefixIndex::RecordRouted(int w, absl::Span<const BlockHash> hashes, absl::Time now) {
  Worker& worker = Get(w);
  const size_t cap = worker.capacity > 0 ? worker.capacity : kDefaultRoutedCap;
  FetchAhead(
      hashes.size(),
      [&](size_t i) {
        worker.blocks.prefetch(hashes[i]);
        worker.routed.prefetch(hashes[i]);
      },
      [&](size_t i) {
        if (worker.blocks.contains(hashes[i])) return;  // already known for sure
        auto [it, added] = worker.routed.try_emplace(hashes[i], now);
        it->second = now;
        // Only a prompt's first block can be a root: every later block's hash chains its
        // parent's, never zero (common/kv/block_hash.h).
        if (added && i == 0) Gained(worker, hashes[i]);
        worker.routed_order.emplace_back(now, hashes[i]);
      });
  TrimRouted(worker, cap);
}

void PrefixIndex::TrimRouted(Worker& worker, size_t cap) {
  while (worker.routed.size() > cap) {
    if (PopOldestRouted(worker)) ++worker.evictions;
  }
}

void PrefixIndex::ForgetRouted(int w, absl::Span<const BlockHash> hashes) {
  auto it = workers_.find(w);
  if (it == workers_.end()) return;
  for (const BlockHash& h : hashes) {
    if (it->second.routed.erase(h) > 0) Lost(it->second, h);
  }
}

void PrefixIndex::Expire(absl::Time now) {
  for (auto& [w, worker] : workers_) {
    while (!worker.routed_order.empty() && worker.routed_order.front().first + kRoutedTtl <= now) {
      PopOldestRouted(worker);
    }
    // Stale order entries (confirmed or forgotten hashes) are bounded by the live ones.
    if (worker.routed.empty()) worker.routed_order.clear();
  }
}

void PrefixIndex::SetCapacity(int w, size_t blocks) {
  Worker& worker = Get(w);
  worker.capacity = blocks;
  OverCapacity(worker);
  if (blocks > 0) TrimRouted(worker, blocks);  // a smaller pool than before
}

size_t PrefixIndex::capacity(int w) const {
  auto it = workers_.find(w);
  return it == workers_.end() ? 0 : it->second.capacity;
}

void PrefixIndex::RemoveWorker(int w) {
  auto it = workers_.find(w);
  if (it == workers_.end()) return;
  Clear(it->second);
  workers_.erase(it);
}

PrefixIndex::Match PrefixIndex::LongestPrefix(int w, absl::Span<const BlockHash> hashes) const {
  auto it = workers_.find(w);
  return it == workers_.end() ? Match{} : Longest(it->second, hashes);
}

std::vector<PrefixIndex::Match> PrefixIndex::LongestPrefixes(
    absl::Span<const int> workers, absl::Span<const BlockHash> hashes) const {
  std::vector<Match> out(workers.size());
  if (hashes.empty()) return out;
  // A worker that does not hold the first block matches nothing: only the root's holders are
  // looked up.
  const absl::InlinedVector<int, 2>* holders =
      workers.size() >= kTrackFromWorkers ? &Holders(hashes[0]) : nullptr;
  if (holders != nullptr && holders->size() <= kFewHolders) {
    for (const int w : *holders) {
      const Match m = Longest(workers_.find(w)->second, hashes);
      for (size_t i = 0; i < workers.size(); ++i) {
        if (workers[i] == w) out[i] = m;
      }
    }
    return out;
  }
  // Few workers asked, or many hold it: two passes, each fetching ahead, over the workers'
  // records, then each one's entry for the first block.
  std::vector<const Worker*> found(workers.size(), nullptr);
  FetchAhead(
      workers.size(), [&](size_t i) { workers_.prefetch(workers[i]); },
      [&](size_t i) {
        auto it = workers_.find(workers[i]);
        if (it != workers_.end()) found[i] = &it->second;
      });
  FetchAhead(
      workers.size(),
      [&](size_t i) {
        if (found[i] == nullptr) return;
        found[i]->blocks.prefetch(hashes[0]);
        if (!found[i]->routed.empty()) found[i]->routed.prefetch(hashes[0]);
      },
      [&](size_t i) {
        if (found[i] != nullptr) out[i] = Longest(*found[i], hashes);
      });
  return out;
}

PrefixIndex::Match PrefixIndex::Longest(const Worker& worker, absl::Span<const BlockHash> hashes) {
  // The walk stops at the first miss; until then each block's entry is fetched kAhead blocks
  // before it is read, as FetchAhead does (a cached prefix of hundreds of blocks is hundreds of
  // misses in a row otherwise).
  const bool routed = !worker.routed.empty();
  const auto fetch = [&](size_t i) {
    worker.blocks.prefetch(hashes[i]);
    if (routed) worker.routed.prefetch(hashes[i]);
  };
  for (size_t i = 0; i < std::min(kAhead, hashes.size()); ++i) fetch(i);
  Match m;
  for (size_t i = 0; i < hashes.size(); ++i) {
    if (i + kAhead < hashes.size()) fetch(i + kAhead);
    const BlockHash& h = hashes[i];
    auto b = worker.blocks.find(h);
    if (b == worker.blocks.end()) {
      if (!worker.routed.contains(h)) break;
      ++m.device_blocks;  // assumed
      continue;
    }
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
  return it == workers_.end() ? 0 : it->second.blocks.size() + it->second.routed.size();
}

int64_t PrefixIndex::evictions(int w) const {
  auto it = workers_.find(w);
  return it == workers_.end() ? 0 : it->second.evictions;
}

uint64_t PrefixIndex::last_seq(int w) const {
  auto it = workers_.find(w);
  return it == workers_.end() ? 0 : it->second.seq;
}

}  // namespace kvserve::router
