// The router's global prefix index: which cached KV blocks each worker holds, per medium, kept
// from the workers' KV events. A batch whose seq is not the next one is a gap: it is not
// applied and the caller asks that worker for a snapshot, which replaces its entries; a new
// instance id (a restart or recycle) clears them. While a worker's stream is unreliable the
// router records its own routing decisions as approximate device entries, so prefix routing
// keeps working until the snapshot arrives.
//
//   PrefixIndex index;
//   if (index.ApplyEvents(w, batch) == PrefixIndex::Apply::kGap) RequestSnapshot(w);
//   PrefixIndex::Match m = index.LongestPrefix(w, request_hashes);
//
// Not thread-safe: the router's core thread owns it.
#ifndef KVSERVE_ROUTER_PREFIX_INDEX_H_
#define KVSERVE_ROUTER_PREFIX_INDEX_H_

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"
#include "common/block_hash.h"
#include "kvserve/v1/kvserve.pb.h"

namespace kvserve::router {

class PrefixIndex {
 public:
  enum class Apply { kApplied, kGap, kIgnored };

  struct Match {
    int device_blocks = 0;  // leading blocks present, on the device tier
    int host_blocks = 0;    // leading blocks present, on the host tier only
    [[nodiscard]] int total() const { return device_blocks + host_blocks; }
  };

  // Applies a batch from worker `w`. kGap: seq skipped (or a new instance that did not start at
  // seq 1); nothing applied, the worker is marked unsynced until ApplySnapshot. kIgnored: an
  // old or duplicate batch.
  Apply ApplyEvents(int w, const kvserve::v1::KvEventBatch& batch);
  // Replaces worker `w`'s entries; batches after snapshot.seq apply normally.
  void ApplySnapshot(int w, const kvserve::v1::KvSnapshot& snapshot);
  // A heartbeat named `instance_id`. True when it is a new process (a restart or recycle) of a
  // worker we knew: its entries are dropped and the caller asks it for a snapshot, so a worker
  // that restarted idle (publishing no event yet) is not credited with its old cache.
  bool SeeInstance(int w, uint64_t instance_id);
  // The router sent a request with these block hashes to `w`: assume the worker now holds them
  // on the device (approximate; replaced by the next snapshot).
  void RecordRouted(int w, absl::Span<const BlockHash> hashes);
  void RemoveWorker(int w);

  // Leading blocks of `hashes` that worker `w` holds (either tier; stops at the first miss).
  [[nodiscard]] Match LongestPrefix(int w, absl::Span<const BlockHash> hashes) const;
  [[nodiscard]] bool synced(int w) const;
  [[nodiscard]] size_t num_blocks(int w) const;
  [[nodiscard]] uint64_t last_seq(int w) const;

 private:
  struct Worker {
    uint64_t instance_id = 0;
    uint64_t seq = 0;
    bool synced = false;
    // hash -> bit 0: on the device, bit 1: on the host.
    absl::flat_hash_map<BlockHash, uint8_t> blocks;
  };
  Worker& Get(int w);
  static void Set(Worker& worker, const std::string& hash_bytes, kvserve::v1::Medium medium,
                  bool on);

  absl::flat_hash_map<int, Worker> workers_;
};

}  // namespace kvserve::router

#endif  // KVSERVE_ROUTER_PREFIX_INDEX_H_
