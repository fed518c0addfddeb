// The vllm:* families of the router's workers, as one vLLM server shows them on its API port:
// read from each worker's /metrics (the address its heartbeat gives) when the router's own
// /metrics is read, and merged, beside the router's kvserve_router_* families. Dashboards,
// autoscalers and endpoint pickers that scrape a vLLM server's API port read the router's.
//
//   std::string text = ReadFleetVllmMetrics(targets, absl::Seconds(1));   // any thread
//
// Pure functions apart from the reads; safe from any thread.
#ifndef KVSERVE_ROUTER_FLEET_VLLM_METRICS_H_
#define KVSERVE_ROUTER_FLEET_VLLM_METRICS_H_

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/net/prometheus_text.h"

namespace kvserve::router {

// The vllm:* families of `sources` (each one worker's /metrics) merged into one server's.
// Series are combined (whatever order their labels are written in) once the labels `worker`
// (kvserve's) and `engine` (vLLM's data-parallel rank) are dropped: counters, histograms, untyped
// and summaries' _sum and _count are summed (a `_created` sample keeps the earliest time); gauges
// are summed, except a name ending in
// `_perc` (a fraction: the mean over the sources that have it) and one ending in `_info` (its
// labels are its value: 1). Summaries' quantiles are dropped: they do not add. Families and
// series in the order first met; a family's type and help are its first source's.
std::vector<MetricFamily> MergeVllmFamilies(const std::vector<std::vector<MetricFamily>>& sources);

// A worker's /metrics: its name and "host:port".
struct MetricsTarget {
  std::string worker;
  std::string endpoint;
};

// Reads every target's /metrics (several at once, each within `timeout`) and returns the merged
// vllm:* families' text, then kvserve_router_vllm_metrics_sources{result="read"|"failed"}: how
// many workers the sums hold. A worker that fails a read, or leaves, takes its counts out of
// the sums (rate() sees a counter reset); each worker's own /metrics keeps its series.
std::string ReadFleetVllmMetrics(const std::vector<MetricsTarget>& targets, absl::Duration timeout);

}  // namespace kvserve::router

#endif  // KVSERVE_ROUTER_FLEET_VLLM_METRICS_H_
