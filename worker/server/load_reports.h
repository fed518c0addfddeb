// The load report every WorkerStatus carries (WorkerStatus.load_report; docs/ROUTING.md,
// "Multi-replica routers"): the engine's load, and per router replica the last placement the
// worker took from it, so that each replica adds to the report only what it placed since.
//
//   reports.Took(req.router_id(), req.placement(), NowMs());  // every GenerateRequest
//   if (reports.Changed(engine.load())) PublishStatus();  // every --load-report-interval
//   reports.Fill(engine.load(), status.mutable_load_report());
//
// Not thread-safe: WorkerServer owns it on the loop thread, as it does its other parts.
#ifndef KVSERVE_WORKER_SERVER_LOAD_REPORTS_H_
#define KVSERVE_WORKER_SERVER_LOAD_REPORTS_H_

#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "kvserve/v1/kvserve.pb.h"
#include "worker/engine.h"

namespace kvserve::worker {

class LoadReports {
 public:
  // Replicas remembered at most; past it, the one heard from least recently is forgotten (a
  // replica that restarted has a new id, so old ids pile up otherwise).
  static constexpr size_t kMaxReplicas = 64;

  // A GenerateRequest numbered `placement` by replica `router_id` arrived (taken or refused:
  // either way the next report holds all it will of it). Unnumbered ones (empty id, or 0) are
  // not recorded; a number at or below the last one's changes nothing.
  void Took(const std::string& router_id, uint64_t placement, int64_t now_ms);
  // Whether `load` or the placements seen differ from the last report filled.
  [[nodiscard]] bool Changed(const Engine::Load& load) const;
  // Writes the report of `load` and the placements seen; remembers it as the last.
  void Fill(const Engine::Load& load, kvserve::v1::LoadReport* out);

 private:
  struct Seen {
    uint64_t placement = 0;
    uint64_t heard = 0;  // took_'s value when it last advanced
    int64_t at_ms = 0;   // and the wall clock then
  };
  absl::flat_hash_map<std::string, Seen> seen_;
  uint64_t took_ = 0;      // placements recorded so far
  uint64_t reported_ = 0;  // took_ at the last report
  Engine::Load last_;
};

}  // namespace kvserve::worker

#endif  // KVSERVE_WORKER_SERVER_LOAD_REPORTS_H_
