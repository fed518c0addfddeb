// kvserve-upstream's Prometheus metrics (docs/OPERATIONS.md): what the bridge asked of its
// upstream and what came back, its scrapes, and the health of the upstream's event stream
// (batches, gaps, replays, blocks it could not place). Each carries the label upstream="NAME".
// Thread-safe (prometheus-cpp): the bridge's loop updates them, the HTTP thread serializes.
#ifndef KVSERVE_UPSTREAM_UPSTREAM_METRICS_H_
#define KVSERVE_UPSTREAM_UPSTREAM_METRICS_H_

#include <memory>
#include <string>

#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"

namespace kvserve::upstream {

class UpstreamMetrics {
 public:
  explicit UpstreamMetrics(const std::string &upstream);
  [[nodiscard]] std::string Serialize() const;

  // kvserve_upstream_requests_total{result}: sent on, refused here (unservable, not ready),
  // ended by the upstream with an error, never reached it (refused as never run: the router
  // placed it elsewhere).
  prometheus::Counter *sent, *refused, *failed, *unreached;
  prometheus::Counter *scrapes_ok, *scrapes_failed;  // kvserve_upstream_scrapes_total{result}
  // kvserve_upstream_event_batches_total{result}: re-hashed and published, or undecodable.
  prometheus::Counter *batches_applied, *batches_undecodable;
  prometheus::Counter *gaps, *replays;  // kvserve_upstream_event_gaps_total, _replays_total
  // kvserve_upstream_restarts_total: new upstream processes seen (their cache forgotten).
  prometheus::Counter *restarts;
  // kvserve_upstream_blocks_skipped_total{reason}: stored blocks not placed (orphan: parent
  // unknown; block_size: another size than the upstream's).
  prometheus::Counter *orphans, *wrong_size;
  prometheus::Gauge *ready;           // kvserve_upstream_ready: 1 when the router may send
  prometheus::Gauge *in_flight;       // kvserve_upstream_requests_in_flight
  prometheus::Gauge *indexed_blocks;  // kvserve_upstream_indexed_blocks: the translator's view

 private:
  std::shared_ptr<prometheus::Registry> registry_;
};

}  // namespace kvserve::upstream

#endif  // KVSERVE_UPSTREAM_UPSTREAM_METRICS_H_
