// The router's global prefix index: which cached KV blocks each worker holds, per medium, kept
// from the workers' KV events. A batch whose seq is not the next one is a gap: it is not
// applied and the caller asks that worker for a snapshot, which replaces its entries; a new
// instance id (a restart or recycle) clears them. While a worker's stream is unreliable the
// router records its own routing decisions as approximate device entries, so prefix routing
// keeps working until the snapshot arrives.
//
// Bounded (a worker's stream is untrusted input): a worker's confirmed entries never exceed its
// pool (device + host blocks, from its heartbeat); a batch or snapshot that would is a broken
// stream, cleared and resynced. Approximate entries live kRoutedTtl at most, are confirmed by
// the worker's events, dropped when their request fails or is aborted, and capped at the pool
// size (oldest out first). Every entry dropped for a bound counts in evictions().
//
//   PrefixIndex index;
//   if (index.ApplyEvents(w, batch) == PrefixIndex::Apply::kGap) RequestSnapshot(w);
//   PrefixIndex::Match m = index.LongestPrefix(w, request_hashes);
//
// A placement asks every worker for a prompt's first block; at 1,024 workers that was most of a
// decision. So the index also keeps, for the first block of each prompt it was asked about over
// 32 workers or more (a root), which workers hold it: a prompt's lookups then walk only those,
// and a worker that does not hold the root matches nothing without being looked at. The holders are
// exact (every change to an entry keeps them), learned by one walk of every worker the first time a
// root is asked about, and forgotten when no worker holds the root any longer.
//
// Not thread-safe: the router's core thread owns it (lookups, though const, fill the roots).
#ifndef KVSERVE_ROUTER_ROUTING_PREFIX_INDEX_H_
#define KVSERVE_ROUTER_ROUTING_PREFIX_INDEX_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/huge_pages.h"
#include "common/kv/block_hash.h"
#include "kvserve/v1/kvserve.pb.h"

namespace kvserve::router {

class PrefixIndex {
 public:
  // kGap: a batch skipped on a stream that was whole (or a new instance of a worker we knew
  // that did not start at seq 1); kJoined: the first batch heard from a worker is not its
  // first (this router subscribed after it started publishing, as at every router start);
  // kAwaitingSnapshot: a batch of a stream already known broken, not applied. The first two
  // need a snapshot; the third waits for the one asked for.
  enum class Apply { kApplied, kGap, kJoined, kAwaitingSnapshot, kIgnored };

  // hash -> bit 0: on the device, bit 1: on the host. Tables of a worker's pool reach several MB
  // and are touched at random: their memory is mapped on huge pages (common/huge_pages.h).
  using BlockTable =
      absl::flat_hash_map<BlockHash, uint8_t, absl::Hash<BlockHash>, std::equal_to<BlockHash>,
                          HugePageAllocator<std::pair<const BlockHash, uint8_t>>>;

  struct Match {
    int device_blocks = 0;  // leading blocks present, on the device tier
    int host_blocks = 0;    // leading blocks present, on the host tier only
    [[nodiscard]] int total() const { return device_blocks + host_blocks; }
  };

  // Applies a batch from worker `w`. kGap, kJoined: nothing applied, the worker is marked
  // unsynced until ApplySnapshot; kAwaitingSnapshot: it already was. kIgnored: an old or
  // duplicate batch.
  Apply ApplyEvents(int w, const kvserve::v1::KvEventBatch& batch);
  // Replaces worker `w`'s entries; batches after snapshot.seq apply normally.
  void ApplySnapshot(int w, const kvserve::v1::KvSnapshot& snapshot);

  // A worker's confirmed entries built from its snapshot, apart from the index: BuildTable is a
  // pure function of its arguments, so snapshots of different workers can be built on other
  // threads (router/routing/snapshot_build.h) and installed by the owner. ApplySnapshot(w, s) is
  // InstallSnapshot(w, BuildTable(s, capacity(w))).
  struct Table {
    uint64_t instance_id = 0;
    uint64_t seq = 0;
    BlockTable blocks;
    int64_t evictions = 0;  // blocks past the pool, not believed
  };
  // `capacity`: the worker's pool in blocks (0: no bound).
  static Table BuildTable(const kvserve::v1::KvSnapshot& snapshot, size_t capacity);
  void InstallSnapshot(int w, Table table);
  // A heartbeat named `instance_id`. True when it is a new process (a restart or recycle) of a
  // worker we knew: its entries are dropped and the caller asks it for a snapshot, so a worker
  // that restarted idle (publishing no event yet) is not credited with its old cache.
  bool SeeInstance(int w, uint64_t instance_id);
  // The router sent a request with these block hashes to `w`: assume the worker now holds them
  // on the device (approximate: until its events confirm them, its next snapshot, or
  // kRoutedTtl after `now`).
  void RecordRouted(int w, absl::Span<const BlockHash> hashes, absl::Time now = absl::Now());
  // The request routed with these hashes failed or was aborted: drop what was only assumed.
  void ForgetRouted(int w, absl::Span<const BlockHash> hashes);
  // Drops approximate entries recorded kRoutedTtl or more before `now`.
  void Expire(absl::Time now);
  // The worker's pool, in blocks (device + host); 0: not known yet (no bound).
  void SetCapacity(int w, size_t blocks);
  void RemoveWorker(int w);

  static constexpr absl::Duration kRoutedTtl = absl::Seconds(30);

  // Leading blocks of `hashes` that worker `w` holds (either tier; stops at the first miss).
  [[nodiscard]] Match LongestPrefix(int w, absl::Span<const BlockHash> hashes) const;
  // LongestPrefix(w, hashes) for each w of `workers`, in their order. Only the workers holding
  // hashes[0] are looked at (the roots above); when many do, the workers' entries are fetched a
  // few workers ahead, so that their cache misses overlap rather than queue.
  [[nodiscard]] std::vector<Match> LongestPrefixes(absl::Span<const int> workers,
                                                   absl::Span<const BlockHash> hashes) const;
  [[nodiscard]] bool synced(int w) const;
  [[nodiscard]] size_t num_blocks(int w) const;
  [[nodiscard]] uint64_t last_seq(int w) const;
  // Its pool as SetCapacity last gave it (0: not known).
  [[nodiscard]] size_t capacity(int w) const;
  // Entries of `w` dropped for a bound (capacity, approximate cap) so far.
  [[nodiscard]] int64_t evictions(int w) const;
  // Roots whose holders the index keeps now.
  [[nodiscard]] size_t tracked_roots() const { return holders_.size(); }
  // The workers listed as holding `root`, sorted; nullopt when it is not tracked.
  [[nodiscard]] std::optional<std::vector<int>> TrackedHolders(const BlockHash& root) const;

  // The most roots kept at once; past it they are all forgotten and learned again.
  static constexpr size_t kMaxTrackedRoots = 1 << 18;

 private:
  struct Worker {
    int id = 0;
    uint64_t instance_id = 0;
    uint64_t seq = 0;
    bool synced = false;
    BlockTable blocks;
    // Approximate device entries: hash -> when routed; and the same in routing order.
    absl::flat_hash_map<BlockHash, absl::Time> routed;
    std::deque<std::pair<absl::Time, BlockHash>> routed_order;
    size_t capacity = 0;
    int64_t evictions = 0;
    // The tracked roots it holds (holders_ lists it under each).
    mutable absl::flat_hash_set<BlockHash> roots;
  };
  // Forgets everything `worker` was thought to hold.
  void Clear(Worker& worker);
  // Drops the oldest entry of routed_order (non-empty) and, unless that entry is stale (the
  // hash since confirmed, forgotten or routed again), its assumed entry: true then.
  bool PopOldestRouted(Worker& worker);
  // Drops the oldest approximate entries past `cap`, counting them as evictions.
  void TrimRouted(Worker& worker, size_t cap);
  // Whether `worker` holds more than its pool could: then it is cleared and unsynced.
  bool OverCapacity(Worker& worker);
  Worker& Get(int w);
  static Match Longest(const Worker& worker, absl::Span<const BlockHash> hashes);
  void Set(Worker& worker, const BlockHash& h, kvserve::v1::Medium medium, bool on);
  // Set for each hash of one event's run (16-byte strings off the wire; a malformed one is
  // skipped).
  void SetRun(Worker& worker, const google::protobuf::RepeatedPtrField<std::string>& run,
              kvserve::v1::Medium medium, bool on);

  // `worker` now holds `h` (an entry of either kind appeared): listed under h if h is tracked.
  void Gained(const Worker& worker, const BlockHash& h) const;
  // `worker` no longer holds `h` (its last entry of h went): unlisted; a root no worker holds is
  // forgotten.
  void Lost(const Worker& worker, const BlockHash& h) const;
  // Takes worker `w` off tracked `root`'s list (the caller dropped root from its roots).
  void Unlist(int w, const BlockHash& root) const;
  // The workers holding `root`, walking every worker to learn them the first time.
  const absl::InlinedVector<int, 2>& Holders(const BlockHash& root) const;
  // Lists `worker` under each tracked root its entries hold (after a snapshot replaced them).
  void RelistRoots(const Worker& worker);

  absl::flat_hash_map<int, Worker> workers_;
  // Tracked root -> the workers holding it (a cache of lookups, exact; filled by const lookups).
  mutable absl::flat_hash_map<BlockHash, absl::InlinedVector<int, 2>> holders_;
};

}  // namespace kvserve::router

#endif  // KVSERVE_ROUTER_ROUTING_PREFIX_INDEX_H_
