// RouterMetrics: per-worker KV-event counters exist at zero from the first heartbeat (so rates
// and alerts see 0, not nothing) and only ever grow; a removed worker's series go.
#include "router/router_metrics.h"

#include <string>

#include "gtest/gtest.h"

namespace kvserve::router {
namespace {

bool Has(const std::string& text, const std::string& line) {
  return text.find(line + "\n") != std::string::npos;
}

TEST(RouterMetricsTest, EventCountersStartAtZeroAndOnlyGrow) {
  RouterMetrics m;
  m.SetWorker("w0", {});
  std::string text = m.Serialize();
  EXPECT_TRUE(Has(text, "kvserve_router_kv_event_gaps_total{worker=\"w0\"} 0")) << text;
  EXPECT_TRUE(Has(text, "kvserve_router_kv_snapshots_total{worker=\"w0\"} 0")) << text;
  EXPECT_TRUE(Has(text, "kvserve_router_kv_event_batches_total{worker=\"w0\"} 0")) << text;
  EXPECT_TRUE(Has(text, "kvserve_router_worker_connect_failures_total{worker=\"w0\"} 0")) << text;
  EXPECT_TRUE(Has(text, "kvserve_router_worker_links_lost_total{worker=\"w0\"} 0")) << text;

  m.SetWorker("w0", {.event_batches = 7, .gaps = 2, .snapshots = 1});
  m.SetWorker("w0", {.event_batches = 3});  // the worker's counts restarted: nothing subtracted
  m.SetWorker("w0", {.event_batches = 5, .gaps = 1, .connect_failures = 2, .links_lost = 4});
  text = m.Serialize();
  EXPECT_TRUE(Has(text, "kvserve_router_worker_connect_failures_total{worker=\"w0\"} 2")) << text;
  EXPECT_TRUE(Has(text, "kvserve_router_worker_links_lost_total{worker=\"w0\"} 4")) << text;
  EXPECT_TRUE(Has(text, "kvserve_router_kv_event_batches_total{worker=\"w0\"} 9")) << text;
  EXPECT_TRUE(Has(text, "kvserve_router_kv_event_gaps_total{worker=\"w0\"} 3")) << text;
  EXPECT_TRUE(Has(text, "kvserve_router_kv_snapshots_total{worker=\"w0\"} 1")) << text;
}

TEST(RouterMetricsTest, ARemovedWorkersSeriesGo) {
  RouterMetrics m;
  m.CountDecision("prefix", "w0");
  m.SetWorker("w0", {.load_blocks = 3, .gaps = 1});
  m.SetWorker("w1", {.load_blocks = 4});
  m.RemoveWorker("w0");
  const std::string text = m.Serialize();
  EXPECT_EQ(text.find("worker=\"w0\""), std::string::npos) << text;
  EXPECT_TRUE(Has(text, "kvserve_router_worker_load_blocks{worker=\"w1\"} 4")) << text;
  // Back again: counting starts afresh.
  m.SetWorker("w0", {.gaps = 2});
  EXPECT_TRUE(Has(m.Serialize(), "kvserve_router_kv_event_gaps_total{worker=\"w0\"} 2"));
}

}  // namespace
}  // namespace kvserve::router
