// The router's Prometheus metrics: the front end's (frontend/core/front_metrics.h: requests,
// connections, admission, latency) and, in the same registry, placement's: routing decisions by
// policy reason, predicted prefix overlap against the cached tokens workers report (routing
// accuracy), each worker as the router sees it, peer KV fetches and links, disaggregation.
// Thread-safe (prometheus-cpp).
#ifndef KVSERVE_ROUTER_ROUTER_METRICS_H_
#define KVSERVE_ROUTER_ROUTER_METRICS_H_

#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "frontend/core/front_metrics.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace kvserve::router {

class RouterMetrics : public frontend::FrontMetrics {
 public:
  RouterMetrics();
  // One routed request: why, and to which worker (by its name).
  void CountDecision(const std::string& reason, const std::string& worker);
  void CountCached(int64_t predicted_tokens, int64_t reported_tokens);
  // A worker as the router sees it, refreshed by the core: in-flight load (blocks), blocks in
  // the prefix index, KV-event batches / gaps / snapshots, messages dropped, failures to make
  // its sockets and framed links broken so far (cumulative), last event lag.
  struct WorkerSeen {
    int64_t load_blocks = 0, index_blocks = 0;
    int64_t event_batches = 0, gaps = 0, joins = 0, snapshots = 0, dropped = 0, index_evictions = 0;
    int64_t connect_failures = 0, links_lost = 0;
    double event_lag_s = 0;
    int inflight_requests = 0;
  };
  void SetWorker(const std::string& worker, const WorkerSeen& seen);
  // The worker left: its series go (a discovered fleet that churns would grow them forever).
  void RemoveWorker(const std::string& worker);
  // A request ended because the worker's replies to it came out of sequence (router_core.h).
  void CountReplyGap(const std::string& worker);
  // Peer KV fetches (router/kv_fetch.h): one whose blocks arrived (wire bytes, blocks the target
  // added, seconds from the ask to the last ack; the achieved rate after it, GB/s), one ended
  // without them by reason (its request prefills them), and an attempt retried by reason.
  void ObserveKvFetch(int64_t bytes, int64_t blocks, double seconds, double gbps);
  // With --kv-fetch: every fetch series at 0 (each result and reason), the rate at `gbps`.
  void StartKvFetch(double gbps);
  void CountKvFetchFallback(const std::string& reason);
  void CountKvFetchRetry(const std::string& reason);
  // Device-to-device links (router/kv_links.h): a fetch attempt over one ended, "done" (whole)
  // or "failed" (the link closed); and the links ready now.
  // With --kv-links: every link series at 0.
  void StartKvLinks();
  void CountKvLinkTransfer(const std::string& result);
  void SetKvLinksReady(int links);
  // Disaggregated serving: a request's prefill phase ended, "prefilled" (its decode worker pulls
  // the KV next, or has it streamed) or "prefill_failed" (its decode worker prefills it).
  void CountDisaggregated(const std::string& result);
  // Disaggregated serving over a link: a prefill phase asked to stream its KV as it computes it.
  void CountKvLayerStream();

 private:
  // The per-worker families (label "worker"); owned by the registry.
  prometheus::Family<prometheus::Gauge>*load_, *index_blocks_, *event_lag_, *inflight_;
  prometheus::Family<prometheus::Counter>*routed_, *event_batches_, *event_gaps_, *event_joins_,
      *snapshots_, *dropped_, *connect_failures_, *links_lost_, *index_evictions_, *reply_gaps_;
  absl::Mutex mu_;
  // Cumulative counts already added, by worker.
  std::map<std::string, WorkerSeen> last_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvserve::router

#endif  // KVSERVE_ROUTER_ROUTER_METRICS_H_
