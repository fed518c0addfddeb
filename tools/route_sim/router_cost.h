// What the simulated routers' own work costs on this machine's CPU (simulator.h), for fleet-scale
// runs (docs/ROUTING.md, "The router at fleet scale"): the placement per request (the routing
// policy over every worker's view and the prefix index, router::Route), and taking the workers'
// KV events (each batch parsed from its wire bytes, as a router receives it, and applied to the
// index). Not counted: HTTP, JSON and the sockets, which do not grow with the fleet
// ("Router CPU per request on long prompts" measures those).
//
//   RouterCost cost;
//   { RouterCost::Timer t(cost.placing_s); Route(...); }
//   cost.TakeBatch(batch, replicas, [&](size_t r, const KvEventBatch& b) { ... });
//
// One thread (the simulator's).
#ifndef KVSERVE_TOOLS_ROUTE_SIM_ROUTER_COST_H_
#define KVSERVE_TOOLS_ROUTE_SIM_ROUTER_COST_H_

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "google/protobuf/arena.h"
#include "kvserve/v1/kvserve.pb.h"
#include "nlohmann/json.hpp"

namespace kvserve::route_sim {

struct RouterCost {
  // Adds the wall time of its scope to `into` (one thread, nothing else running on it: the
  // simulator's own CPU time).
  class Timer {
   public:
    explicit Timer(double& into) : into_(into), start_(std::chrono::steady_clock::now()) {}
    ~Timer() {
      into_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    }
    Timer(const Timer&) = delete;
    Timer& operator=(const Timer&) = delete;

   private:
    double& into_;
    std::chrono::steady_clock::time_point start_;
  };

  double placing_s = 0;       // every replica's placements
  double events_s = 0;        // every replica's parsing and applying of event batches
  int64_t placements = 0;     // requests placed (every replica's)
  int64_t block_events = 0;   // block stored / removed events one replica took
  int64_t event_batches = 0;  // batches one replica took
  int64_t peak_entries = 0;   // (block, worker) entries in one replica's index, at most
  std::vector<char> arena_block = std::vector<char>(256 << 10);  // TakeBatch's parses

  void SeeEntries(int64_t entries) { peak_entries = std::max(peak_entries, entries); }

  // A worker's batch as each of `replicas` routers takes it: parsed from its wire bytes, then
  // apply(replica, parsed), timed; counted once.
  template <typename Apply>
  void TakeBatch(const kvserve::v1::KvEventBatch& batch, size_t replicas, const Apply& apply) {
    const std::string wire = batch.SerializeAsString();
    for (const kvserve::v1::KvEvent& e : batch.events()) {
      block_events += e.stored().block_hashes_size() + e.removed().block_hashes_size();
    }
    ++event_batches;
    for (size_t r = 0; r < replicas; ++r) {
      Timer timer(events_s);
      // Into an arena over a reused block, as router::WorkerPool parses them (not a string
      // allocated per block hash, which the real router does not pay).
      google::protobuf::ArenaOptions options;
      options.initial_block = arena_block.data();
      options.initial_block_size = arena_block.size();
      google::protobuf::Arena arena(options);
      auto* received = google::protobuf::Arena::CreateMessage<kvserve::v1::KvEventBatch>(&arena);
      if (received->ParseFromString(wire)) apply(r, *received);  // our own bytes: it parses
    }
  }

  // What the run's trace made one replica do: the same every run (SimReport::json).
  [[nodiscard]] nlohmann::json Counts(double virtual_seconds) const {
    const double seconds = virtual_seconds > 0 ? virtual_seconds : 1;
    return {{"block_events_per_s", static_cast<double>(block_events) / seconds},
            {"event_batches_per_s", static_cast<double>(event_batches) / seconds},
            {"peak_index_entries", peak_entries}};
  }
  // What it took this CPU, per request and as a share of a core over the run's virtual time,
  // for one replica: differs run to run (SimReport::router_cpu).
  [[nodiscard]] nlohmann::json Cpu(double virtual_seconds, int replicas) const {
    const double seconds = virtual_seconds > 0 ? virtual_seconds : 1;
    const double placed = placements > 0 ? static_cast<double>(placements) : 1;
    return {{"placing_us_per_request", 1e6 * placing_s / placed},
            {"events_us_per_request", 1e6 * events_s / placed},
            {"events_core_share", events_s / replicas / seconds}};
  }
};

}  // namespace kvserve::route_sim

#endif  // KVSERVE_TOOLS_ROUTE_SIM_ROUTER_COST_H_
