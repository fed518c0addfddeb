// The routing simulator on a small generated trace: every request served, the same report
// for the same inputs, and at light load the cost policy making the greedy bound's decisions
// while round robin scatters the sessions.
#include "gtest/gtest.h"
#include "tests/testing/paths.h"
#include "tests/testing/status_matchers.h"
#include "tools/route_sim/goodput.h"
#include "tools/route_sim/simulator.h"
#include "tools/trace/generate.h"

namespace kvserve::route_sim {
namespace {

std::vector<trace::TraceRequest> Sessions() {
  absl::StatusOr<std::vector<trace::TraceRequest>> t = trace::GenerateTrace({.shape = "multi-turn",
                                                                             .duration_s = 60,
                                                                             .rate = 0.5,
                                                                             .min_turns = 3,
                                                                             .max_turns = 6,
                                                                             .turn_input = 300,
                                                                             .turn_output = 100,
                                                                             .think_s = 5,
                                                                             .first_input = 1500});
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *t : std::vector<trace::TraceRequest>{};
}

SimOptions Options(const std::string& policy, bool instant) {
  SimOptions o;
  o.workers = 4;
  o.capacity_blocks = 4000;
  o.engine.model_dir = kvserve::testing::SourceDir() + "/tools/route_sim/models/llama-3.1-8b";
  o.engine.backend.sim_gpu = *worker::GpuPreset("h100");
  o.routing.policy = policy;
  o.instant = instant;
  o.speedup = 4;
  return o;
}

TEST(RouteSimTest, ServesEveryRequestTheSameWayTwice) {
  const auto trace = Sessions();
  ASSERT_GT(trace.size(), 20u);
  ASSERT_OK_AND_ASSIGN(SimReport a, Simulate(trace, Options("cost", false)));
  EXPECT_EQ(a.json["requests"], static_cast<int64_t>(trace.size()));
  EXPECT_EQ(a.json["errors"], 0);
  EXPECT_GT(a.json["p50_ttft_ms"].get<double>(), 0);
  EXPECT_GT(a.json["utilization"].get<double>(), 0);
  ASSERT_OK_AND_ASSIGN(SimReport b, Simulate(trace, Options("cost", false)));
  EXPECT_EQ(a.json.dump(), b.json.dump());
}

TEST(RouteSimTest, AtLightLoadTheCostPolicyKeepsSessionsWhereTheirCacheIs) {
  const auto trace = Sessions();
  ASSERT_OK_AND_ASSIGN(SimReport cost, Simulate(trace, Options("cost", true)));
  ASSERT_OK_AND_ASSIGN(SimReport greedy, Simulate(trace, Options("greedy", true)));
  ASSERT_OK_AND_ASSIGN(SimReport rr, Simulate(trace, Options("round_robin", true)));
  EXPECT_DOUBLE_EQ(cost.json["hit_rate"], greedy.json["hit_rate"]);
  EXPECT_GT(cost.json["hit_rate"].get<double>(), 0.5);
  EXPECT_LT(rr.json["hit_rate"].get<double>(), 0.5 * cost.json["hit_rate"].get<double>());
  // Light load: steps take no time.
  EXPECT_EQ(cost.json["p99_ttft_ms"].get<double>(), 0);
}

// One prefill worker and three decode workers: every request served, the long prompts
// prefilled on the prefill worker and their blocks adopted by the decode workers, which then
// prefill only what did not come; the prefill worker never decodes.
TEST(RouteSimTest, DisaggregatedServesEveryRequest) {
  const auto trace = Sessions();
  SimOptions o = Options("cost", false);
  o.prefill_workers = 1;
  o.max_local_prefill_tokens = 1000;
  o.disagg_gbps = 10;
  ASSERT_OK_AND_ASSIGN(SimReport r, Simulate(trace, o));
  EXPECT_EQ(r.json["requests"], static_cast<int64_t>(trace.size()));
  EXPECT_EQ(r.json["errors"], 0);
  // Every session's first prompt (1500 tokens) is over the limit; later turns mostly are not.
  EXPECT_GT(r.json["disaggregated"].get<int64_t>(), 0);
  EXPECT_LT(r.json["disaggregated"].get<int64_t>(), static_cast<int64_t>(trace.size()));
  EXPECT_GT(r.json["fetch_seconds"].get<double>(), 0);
  EXPECT_GT(r.json["p50_tpot_ms"].get<double>(), 0);
  // The prefill worker took only the phases, one per disaggregated request.
  EXPECT_EQ(r.json["workers"][0]["requests"], r.json["disaggregated"]);
  ASSERT_OK_AND_ASSIGN(SimReport again, Simulate(trace, o));
  EXPECT_EQ(r.json.dump(), again.json.dump());
  o.prefill_workers = 4;
  EXPECT_THAT(Simulate(trace, o), kvserve::testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                                             ::testing::HasSubstr("decode")));
}

// Layer streaming: the same requests, their phases' blocks sent as the steps compute them. The
// decode workers wait less for the blocks once the phases ended, and the disaggregated requests
// less for their first token.
TEST(RouteSimTest, LayerStreamingHidesTheTransferBehindThePrefill) {
  const auto trace = Sessions();
  SimOptions o = Options("cost", false);
  o.prefill_workers = 1;
  o.max_local_prefill_tokens = 1000;
  o.disagg_gbps = 20;  // the link outruns the prefill: streamed, little is left to wait for
  o.engine.scheduler.max_num_batched_tokens = 512;  // a phase takes several steps
  ASSERT_OK_AND_ASSIGN(SimReport after, Simulate(trace, o));
  o.disagg_stream_layers = true;
  ASSERT_OK_AND_ASSIGN(SimReport streamed, Simulate(trace, o));
  EXPECT_EQ(streamed.json["requests"], static_cast<int64_t>(trace.size()));
  EXPECT_EQ(streamed.json["errors"], 0);
  EXPECT_EQ(streamed.json["disaggregated"], after.json["disaggregated"]);
  EXPECT_TRUE(streamed.json["fetch_fallbacks"].empty()) << streamed.json["fetch_fallbacks"];
  // Post-phase, every block's link time is waited for; streamed, a fraction of it.
  EXPECT_NEAR(after.json["exposed_fetch_seconds"].get<double>(),
              after.json["fetch_seconds"].get<double>(), 1e-9);
  EXPECT_LT(streamed.json["exposed_fetch_seconds"].get<double>(),
            0.5 * streamed.json["fetch_seconds"].get<double>());
  EXPECT_LT(streamed.json["p50_disaggregated_ttft_ms"].get<double>(),
            after.json["p50_disaggregated_ttft_ms"].get<double>());
}

TEST(HeldRequestsTest, FirstComeOrShortestUncachedFirstTiesInArrivalOrder) {
  const auto fill = [](HeldRequests& q) {
    for (const auto& [index, uncached] : {std::pair{0, 900}, {1, 100}, {2, 500}, {3, 100}}) {
      q.Push({.index = index, .arrival = static_cast<double>(index), .uncached_tokens = uncached});
    }
  };
  HeldRequests fcfs(QueueOrder::kFirstCome), shortest(QueueOrder::kShortestUncached);
  fill(fcfs);
  fill(shortest);
  std::vector<int> a, b;
  while (!fcfs.empty()) a.push_back(fcfs.Pop().index);
  while (!shortest.empty()) b.push_back(shortest.Pop().index);
  EXPECT_EQ(a, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(b, (std::vector<int>{1, 3, 2, 0}));
  EXPECT_EQ(fcfs.max_depth(), 4u);
}

// The router's queue: with at most one request per worker, the replica holds the rest and
// places them as requests end; every request is served either way, their waits count in TTFT,
// and the order changes who waits.
TEST(RouteSimTest, ARouterLimitHoldsRequestsAndServesThemAll) {
  const auto trace = Sessions();
  SimOptions o = Options("cost", false);
  o.speedup = 40;
  ASSERT_OK_AND_ASSIGN(SimReport free, Simulate(trace, o));
  EXPECT_FALSE(free.json.contains("router_queue"));
  o.router_max_inflight = 1;
  ASSERT_OK_AND_ASSIGN(SimReport fcfs, Simulate(trace, o));
  o.queue_order = QueueOrder::kShortestUncached;
  ASSERT_OK_AND_ASSIGN(SimReport shortest, Simulate(trace, o));
  for (const SimReport* r : {&fcfs, &shortest}) {
    EXPECT_EQ(r->json["requests"], static_cast<int64_t>(trace.size()));
    EXPECT_EQ(r->json["errors"], 0);
    EXPECT_GT(r->json["router_queue"]["held"].get<int64_t>(), 0);
    EXPECT_GT(r->json["router_queue"]["max_depth"].get<int64_t>(), 1);
    EXPECT_GT(r->json["p99_ttft_ms"].get<double>(), free.json["p99_ttft_ms"].get<double>());
  }
  EXPECT_NE(fcfs.json["router_queue"].dump(), shortest.json["router_queue"].dump());
  o.router_max_inflight = -1;
  EXPECT_THAT(Simulate(trace, o),
              kvserve::testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                         ::testing::HasSubstr("--router-max-inflight-per-worker")));
}

TEST(RouteSimTest, BadOptionsAreRefusedByName) {
  SimOptions o = Options("cost", true);
  o.routing.policy = "random";
  EXPECT_THAT(Simulate(Sessions(), o),
              kvserve::testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                         ::testing::HasSubstr("'random'")));
  o = Options("cost", true);
  o.capacity_blocks = 0;
  EXPECT_THAT(Simulate(Sessions(), o),
              kvserve::testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                         ::testing::HasSubstr("KV pool")));
}

TEST(RouteSimTest, GoodputIsTheFastestReplayWithinTheSlo) {
  const auto trace = Sessions();
  const Slo slo{.ttft_p99_ms = 300, .tpot_p99_ms = 100};
  ASSERT_OK_AND_ASSIGN(Goodput g,
                       FindGoodput(trace, Options("cost", false), slo,
                                   {.min_speedup = 0.5, .max_speedup = 200, .steps = 5}));
  ASSERT_GT(g.speedup, 0.5);
  ASSERT_LT(g.speedup, 200);
  EXPECT_EQ(g.tries.size(), 7u);  // both bounds, then the bisections
  // The answer met the SLO; every faster try missed it; its rate is the window's at that pace.
  for (const GoodputTry& t : g.tries) {
    if (t.speedup > g.speedup) {
      EXPECT_FALSE(t.met) << t.speedup;
    }
    if (t.speedup == g.speedup) {
      EXPECT_TRUE(t.met);
      EXPECT_LE(t.report["p99_ttft_ms"].get<double>(), slo.ttft_p99_ms);
      EXPECT_EQ(t.requests_per_second, g.requests_per_second);
    }
  }
  EXPECT_GT(g.requests_per_second, 0);
  EXPECT_THAT(FindGoodput(trace, Options("cost", false), slo, {.min_speedup = 2, .max_speedup = 1}),
              kvserve::testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                         ::testing::HasSubstr("0 < min < max")));
  // Nothing meets an impossible target: no rate, one try.
  ASSERT_OK_AND_ASSIGN(Goodput none, FindGoodput(trace, Options("cost", false),
                                                 {.ttft_p99_ms = 0.001}, {.min_speedup = 1}));
  EXPECT_EQ(none.speedup, 0);
  EXPECT_EQ(none.tries.size(), 1u);
}

}  // namespace
}  // namespace kvserve::route_sim
