// Builds workers' prefix-index tables from their KV snapshots on several threads. A restarted
// router hears a snapshot from every worker within moments, and each is independent: parsing
// one and building its table (PrefixIndex::BuildTable) is most of a rebuild, so they are spread
// over threads and only installed, in order, by the index's owner.
//
//   std::vector<SnapshotJob> jobs = {{w, wire_bytes, index.capacity(w)}, ...};
//   for (auto& built : BuildSnapshots(jobs, kSnapshotThreads))
//     if (built.table.ok()) index.InstallSnapshot(built.worker, *std::move(built.table));
//
// Thread-safe: the jobs' bytes are only read; each job's result is its own.
#ifndef KVSERVE_ROUTER_ROUTING_SNAPSHOT_BUILD_H_
#define KVSERVE_ROUTER_ROUTING_SNAPSHOT_BUILD_H_

#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "router/routing/prefix_index.h"

namespace kvserve::router {

struct SnapshotJob {
  int worker = -1;
  std::string_view wire;  // a serialized KvSnapshot; must outlive BuildSnapshots
  size_t capacity = 0;    // the worker's pool in blocks (0: no bound)
};

struct BuiltSnapshot {
  int worker = -1;
  absl::StatusOr<PrefixIndex::Table> table;  // InvalidArgument: the bytes are not a KvSnapshot
};

// The threads a router builds snapshots on: the machine's cores, at most 8.
int SnapshotThreads();

// Results in the jobs' order. Runs on the calling thread and up to `threads` - 1 others.
std::vector<BuiltSnapshot> BuildSnapshots(absl::Span<const SnapshotJob> jobs, int threads);

}  // namespace kvserve::router

#endif  // KVSERVE_ROUTER_ROUTING_SNAPSHOT_BUILD_H_
