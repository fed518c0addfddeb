#include "router/routing/snapshot_build.h"

#include <algorithm>
#include <atomic>
#include <limits>
#include <thread>

#include "absl/strings/str_cat.h"
#include "google/protobuf/arena.h"

namespace kvserve::router {
namespace {

namespace pb = ::kvserve::v1;

BuiltSnapshot Build(const SnapshotJob& job) {
  // On an arena: a snapshot's blocks are not allocated (and freed) one by one, which made up a
  // third of a restarted router's rebuild (prefix_index_bench, BM_RebuildFromSnapshots).
  google::protobuf::Arena arena;
  auto* snapshot = google::protobuf::Arena::CreateMessage<pb::KvSnapshot>(&arena);
  if (job.wire.size() > static_cast<size_t>(std::numeric_limits<int>::max()) ||
      !snapshot->ParseFromArray(job.wire.data(), static_cast<int>(job.wire.size()))) {
    return {job.worker, absl::InvalidArgumentError(absl::StrCat("malformed KvSnapshot payload (",
                                                                job.wire.size(), " bytes)"))};
  }
  return {job.worker, PrefixIndex::BuildTable(*snapshot, job.capacity)};
}

}  // namespace

int SnapshotThreads() {
  return static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 8u));
}

std::vector<BuiltSnapshot> BuildSnapshots(absl::Span<const SnapshotJob> jobs, int threads) {
  std::vector<BuiltSnapshot> out(jobs.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next++; i < jobs.size(); i = next++) out[i] = Build(jobs[i]);
  };
  const int helpers = std::clamp<int>(static_cast<int>(jobs.size()) - 1, 0, threads - 1);
  std::vector<std::jthread> pool;
  pool.reserve(helpers);
  for (int t = 0; t < helpers; ++t) pool.emplace_back(work);
  work();
  for (std::jthread& t : pool) t.join();  // before `out` is handed back
  return out;
}

}  // namespace kvserve::router
