// RouterMetrics: per-worker KV-event counters exist at zero from the first heartbeat (so rates
// and alerts see 0, not nothing) and only ever grow.
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

  m.SetWorker("w0", {.event_batches = 7, .gaps = 2, .snapshots = 1});
  m.SetWorker("w0", {.event_batches = 3});  // the worker's counts restarted: nothing subtracted
  m.SetWorker("w0", {.event_batches = 5, .gaps = 1});
  text = m.Serialize();
  EXPECT_TRUE(Has(text, "kvserve_router_kv_event_batches_total{worker=\"w0\"} 9")) << text;
  EXPECT_TRUE(Has(text, "kvserve_router_kv_event_gaps_total{worker=\"w0\"} 3")) << text;
  EXPECT_TRUE(Has(text, "kvserve_router_kv_snapshots_total{worker=\"w0\"} 1")) << text;
}

}  // namespace
}  // namespace kvserve::router
