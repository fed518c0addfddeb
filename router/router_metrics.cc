#include "router/router_metrics.h"

#include "common/kv/kv_transfer.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"

namespace kvserve::router {
RouterMetrics::RouterMetrics() {
  auto gauge = [&](const char* name, const char* help) {
    return &prometheus::BuildGauge().Name(name).Help(help).Register(registry());
  };
  auto counter = [&](const char* name, const char* help) {
    return &prometheus::BuildCounter().Name(name).Help(help).Register(registry());
  };
  load_ =
      gauge("kvserve_router_worker_load_blocks", "Blocks of the requests in flight on the worker");
  index_blocks_ =
      gauge("kvserve_router_index_blocks", "Blocks the prefix index holds for the worker");
  event_lag_ = gauge("kvserve_router_kv_event_lag_seconds",
                     "Delay of the worker's last KV-event batch (receive time - its timestamp)");
  routed_ = counter("kvserve_router_routed_total", "Requests sent to each worker");
  event_batches_ = counter("kvserve_router_kv_event_batches_total", "KV-event batches received");
  event_gaps_ = counter("kvserve_router_kv_event_gaps_total",
                        "KV-event batches out of sequence (each asks the worker for a snapshot)");
  event_joins_ = counter("kvserve_router_kv_event_joins_total",
                         "KV-event streams joined mid-way (the router started after the worker; "
                         "each asks the worker for a snapshot, expected once per worker)");
  snapshots_ = counter("kvserve_router_kv_snapshots_total", "Index snapshots applied (resyncs)");
  dropped_ = counter("kvserve_router_dropped_messages_total",
                     "Messages from the worker dropped as malformed or impossible");
  connect_failures_ = counter("kvserve_router_worker_connect_failures_total",
                              "Times the worker's sockets could not be made (the router's "
                              "open-file limit, or an endpoint ZeroMQ refuses); it is tried again");
  links_lost_ = counter("kvserve_router_worker_links_lost_total",
                        "Framed links to the worker (--worker-link=tcp) that broke; the requests "
                        "sent on one move to another worker or fail");
  reply_gaps_ = counter("kvserve_router_reply_gaps_total",
                        "Requests ended because the worker's replies to them came out of sequence "
                        "(a reply lost on the link)");
  inflight_ =
      gauge("kvserve_router_worker_inflight_requests",
            "Requests the router has on the worker now (--max-inflight-per-worker caps it)");
  index_evictions_ = counter("kvserve_router_index_evictions_total",
                             "Prefix-index entries of the worker dropped for a bound (its pool "
                             "size, the cap on assumed entries)");
}

void RouterMetrics::CountDecision(const std::string& reason, const std::string& worker) {
  prometheus::BuildCounter()
      .Name("kvserve_router_decisions_total")
      .Help("Routing decisions by reason")
      .Register(registry())
      .Add({{"reason", reason}})
      .Increment();
  routed_->Add({{"worker", worker}}).Increment();
}

void RouterMetrics::CountCached(int64_t predicted, int64_t reported) {
  auto& fam = prometheus::BuildCounter()
                  .Name("kvserve_router_prefix_tokens_total")
                  .Help("Prompt tokens the router predicted cached vs the worker reported cached")
                  .Register(registry());
  fam.Add({{"kind", "predicted"}}).Increment(static_cast<double>(predicted));
  fam.Add({{"kind", "reported"}}).Increment(static_cast<double>(reported));
}

void RouterMetrics::SetWorker(const std::string& worker, const WorkerSeen& seen) {
  const prometheus::Labels labels = {{"worker", worker}};
  load_->Add(labels).Set(static_cast<double>(seen.load_blocks));
  index_blocks_->Add(labels).Set(static_cast<double>(seen.index_blocks));
  event_lag_->Add(labels).Set(seen.event_lag_s);
  inflight_->Add(labels).Set(seen.inflight_requests);
  absl::MutexLock lock(&mu_);
  WorkerSeen& last = last_[worker];
  // Each series exists from the worker's first heartbeat (at 0), so that rates and alerts on
  // them see zero rather than nothing; a count that went down (the worker restarted) adds 0.
  auto add = [&](prometheus::Family<prometheus::Counter>* family, int64_t now, int64_t& before) {
    prometheus::Counter& c = family->Add(labels);
    if (now > before) c.Increment(static_cast<double>(now - before));
    before = now;
  };
  add(event_batches_, seen.event_batches, last.event_batches);
  add(event_gaps_, seen.gaps, last.gaps);
  add(event_joins_, seen.joins, last.joins);
  add(snapshots_, seen.snapshots, last.snapshots);
  add(dropped_, seen.dropped, last.dropped);
  add(connect_failures_, seen.connect_failures, last.connect_failures);
  add(links_lost_, seen.links_lost, last.links_lost);
  add(index_evictions_, seen.index_evictions, last.index_evictions);
  reply_gaps_->Add(labels);  // exists at 0 from the first heartbeat
}

void RouterMetrics::RemoveWorker(const std::string& worker) {
  const prometheus::Labels labels = {{"worker", worker}};
  for (prometheus::Family<prometheus::Gauge>* f : {load_, index_blocks_, event_lag_, inflight_}) {
    f->Remove(&f->Add(labels));
  }
  for (prometheus::Family<prometheus::Counter>* f :
       {routed_, event_batches_, event_gaps_, event_joins_, snapshots_, dropped_, connect_failures_,
        links_lost_, index_evictions_, reply_gaps_}) {
    f->Remove(&f->Add(labels));
  }
  absl::MutexLock lock(&mu_);
  last_.erase(worker);
}

void RouterMetrics::CountReplyGap(const std::string& worker) {
  reply_gaps_->Add({{"worker", worker}}).Increment();
}

namespace {

prometheus::Family<prometheus::Counter>& FetchCounter(prometheus::Registry& r, const char* name,
                                                      const char* help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(r);
}

prometheus::Family<prometheus::Counter>& Fetches(prometheus::Registry& r) {
  return FetchCounter(
      r, "kvserve_router_kv_fetches_total",
      "Peer KV fetches: done (the blocks arrived) or fallback (the request prefilled them)");
}

prometheus::Family<prometheus::Counter>& Fallbacks(prometheus::Registry& r) {
  return FetchCounter(r, "kvserve_router_kv_fetch_fallbacks_total",
                      "Peer KV fetches that ended without their blocks, by reason");
}

prometheus::Family<prometheus::Counter>& Retries(prometheus::Registry& r) {
  return FetchCounter(r, "kvserve_router_kv_fetch_retries_total",
                      "Peer KV fetch attempts that failed and were tried once more, by reason");
}

prometheus::Counter& FetchBytes(prometheus::Registry& r) {
  return FetchCounter(r, "kvserve_router_kv_fetch_bytes_total",
                      "Wire bytes of KV blocks relayed between workers by done fetches")
      .Add({});
}

prometheus::Counter& FetchBlocks(prometheus::Registry& r) {
  return FetchCounter(r, "kvserve_router_kv_fetch_blocks_total",
                      "KV blocks done fetches added to their target's cache")
      .Add({});
}

prometheus::Histogram& FetchSeconds(prometheus::Registry& r) {
  static const prometheus::Histogram::BucketBoundaries kBuckets = {
      1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 500e-3, 1, 2.5, 5, 10};
  return prometheus::BuildHistogram()
      .Name("kvserve_router_kv_fetch_seconds")
      .Help("A done fetch's time, from the ask to the target's last acknowledgement")
      .Register(r)
      .Add({}, kBuckets);
}

prometheus::Gauge& FetchGbps(prometheus::Registry& r) {
  return prometheus::BuildGauge()
      .Name("kvserve_router_kv_fetch_gbps")
      .Help("The achieved transfer rate of fetches (a moving average, GB/s)")
      .Register(r)
      .Add({});
}

}  // namespace

void RouterMetrics::StartKvFetch(double gbps) {
  for (const char* result : {"done", "fallback"}) Fetches(registry()).Add({{"result", result}});
  for (std::string_view reason : kKvTransferFailureReasons) {
    Fallbacks(registry()).Add({{"reason", std::string(reason)}});
    Retries(registry()).Add({{"reason", std::string(reason)}});
  }
  FetchBytes(registry());
  FetchBlocks(registry());
  FetchSeconds(registry());
  FetchGbps(registry()).Set(gbps);
}

void RouterMetrics::ObserveKvFetch(int64_t bytes, int64_t blocks, double seconds, double gbps) {
  Fetches(registry()).Add({{"result", "done"}}).Increment();
  FetchBytes(registry()).Increment(static_cast<double>(bytes));
  FetchBlocks(registry()).Increment(static_cast<double>(blocks));
  FetchSeconds(registry()).Observe(seconds);
  FetchGbps(registry()).Set(gbps);
}

void RouterMetrics::CountKvFetchFallback(const std::string& reason) {
  Fetches(registry()).Add({{"result", "fallback"}}).Increment();
  Fallbacks(registry()).Add({{"reason", reason}}).Increment();
}

void RouterMetrics::CountDisaggregated(const std::string& result) {
  prometheus::BuildCounter()
      .Name("kvserve_router_disaggregated_requests_total")
      .Help("Requests prefilled on a prefill worker first, by how the prefill phase ended")
      .Register(registry())
      .Add({{"result", result}})
      .Increment();
}

void RouterMetrics::CountKvLayerStream() {
  prometheus::BuildCounter()
      .Name("kvserve_router_kv_layer_streams_total")
      .Help("Prefill phases asked to stream their KV over a device-to-device link layer by layer")
      .Register(registry())
      .Add({})
      .Increment();
}

void RouterMetrics::CountKvFetchRetry(const std::string& reason) {
  Retries(registry()).Add({{"reason", reason}}).Increment();
}

namespace {

prometheus::Family<prometheus::Counter>& LinkTransfers(prometheus::Registry& r) {
  return prometheus::BuildCounter()
      .Name("kvserve_router_kv_link_transfers_total")
      .Help("Fetch attempts whose blocks crossed a device-to-device link, by how they ended")
      .Register(r);
}

prometheus::Gauge& LinksReady(prometheus::Registry& r) {
  return prometheus::BuildGauge()
      .Name("kvserve_router_kv_links_ready")
      .Help("Device-to-device KV links between worker pairs ready to carry transfers")
      .Register(r)
      .Add({});
}

}  // namespace

void RouterMetrics::StartKvLinks() {
  for (const char* result : {"done", "failed"}) LinkTransfers(registry()).Add({{"result", result}});
  LinksReady(registry()).Set(0);
}

void RouterMetrics::CountKvLinkTransfer(const std::string& result) {
  LinkTransfers(registry()).Add({{"result", result}}).Increment();
}

void RouterMetrics::SetKvLinksReady(int links) { LinksReady(registry()).Set(links); }

}  // namespace kvserve::router
