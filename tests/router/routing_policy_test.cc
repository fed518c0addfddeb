#include "router/routing_policy.h"

#include <map>
#include <set>

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace kvserve::router {
namespace {

std::vector<BlockHash> Chain(int n, uint64_t salt) {
  std::vector<uint32_t> tokens(n * 4);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(i + salt * 1000);
  return HashFullBlocks(tokens, 4, "k");
}

std::vector<WorkerView> Workers(int n) {
  std::vector<WorkerView> out;
  for (int i = 0; i < n; ++i) out.push_back({i, "w" + std::to_string(i), true, 0, 0});
  return out;
}

TEST(RoutingPolicyTest, PrefixPicksTheWorkerHoldingTheLongestPrefix) {
  PrefixIndex index;
  const auto chain = Chain(10, 1);
  index.RecordRouted(2, absl::MakeSpan(chain).subspan(0, 8));
  index.RecordRouted(1, absl::MakeSpan(chain).subspan(0, 3));
  auto workers = Workers(4);
  uint64_t rr = 0;
  ASSERT_OK_AND_ASSIGN(Decision d, Route({}, workers, index, chain, "", &rr));
  EXPECT_EQ(d.worker, 2);
  EXPECT_EQ(d.reason, RouteReason::kPrefix);
  EXPECT_EQ(d.predicted_cached_blocks, 8);
  // Load weighs in: a busy worker loses to an idle one when its saving is smaller.
  workers[2].active_blocks = 20;
  ASSERT_OK_AND_ASSIGN(d, Route({}, workers, index, chain, "", &rr));
  EXPECT_EQ(d.worker, 1);
}

TEST(RoutingPolicyTest, FallsBackToLeastLoadedWhenImbalanced) {
  PrefixIndex index;
  const auto chain = Chain(10, 2);
  index.RecordRouted(0, chain);
  auto workers = Workers(3);
  workers[0].active_blocks = 1500;  // spread 1400 > 512 blocks and 1500 > 1.5 × 100
  workers[1].active_blocks = 100;
  workers[2].active_blocks = 800;
  uint64_t rr = 0;
  ASSERT_OK_AND_ASSIGN(Decision d, Route({}, workers, index, chain, "", &rr));
  EXPECT_EQ(d.worker, 1);
  EXPECT_EQ(d.reason, RouteReason::kBalance);
}

TEST(RoutingPolicyTest, NewPrefixesSpreadToTheWorkerCachingLeast) {
  PrefixIndex index;
  index.RecordRouted(0, Chain(10, 1));
  index.RecordRouted(1, Chain(3, 2));
  const auto workers = Workers(3);
  uint64_t rr = 0;
  // Nobody caches this prompt: the worker caching least (2, with nothing) gets it.
  ASSERT_OK_AND_ASSIGN(Decision d, Route({}, workers, index, Chain(8, 50), "", &rr));
  EXPECT_EQ(d.worker, 2);
  EXPECT_EQ(d.reason, RouteReason::kSpread);
  // Three empty workers and three new prompts, each recorded as routed: one each.
  PrefixIndex empty;
  std::set<int> picked;
  for (int i = 0; i < 3; ++i) {
    const auto prompt = Chain(8, 100 + i);
    ASSERT_OK_AND_ASSIGN(Decision e, Route({}, workers, empty, prompt, "", &rr));
    empty.RecordRouted(e.worker, prompt);
    picked.insert(e.worker);
  }
  EXPECT_EQ(picked.size(), 3u);
  // A prompt half cached somewhere is routed by cost, not spread.
  auto half = Chain(10, 1);
  half.resize(5);
  const auto rest = Chain(5, 77);
  half.insert(half.end(), rest.begin(), rest.end());
  ASSERT_OK_AND_ASSIGN(Decision f, Route({}, workers, index, half, "", &rr));
  EXPECT_EQ(f.worker, 0);
  EXPECT_EQ(f.reason, RouteReason::kPrefix);
}

TEST(RoutingPolicyTest, CachedPrefixOutweighsModestLoad) {
  // 34-block prompts sharing 32 blocks: the worker holding them keeps the next prompt while it
  // carries up to three such requests more than an idle worker (default weights).
  PrefixIndex index;
  const auto shared = Chain(32, 7);
  index.RecordRouted(1, shared);
  auto prompt = shared;
  const auto question = Chain(2, 99);
  prompt.insert(prompt.end(), question.begin(), question.end());
  auto workers = Workers(2);
  uint64_t rr = 0;
  for (int in_flight = 0; in_flight <= 4; ++in_flight) {
    workers[1].active_blocks = 35 * in_flight;
    ASSERT_OK_AND_ASSIGN(Decision d, Route({}, workers, index, prompt, "", &rr));
    EXPECT_EQ(d.worker, in_flight <= 3 ? 1 : 0) << in_flight << " requests in flight";
  }
}

TEST(RoutingPolicyTest, NeverPicksIneligibleWorkers) {
  PrefixIndex index;
  const auto chain = Chain(4, 3);
  index.RecordRouted(0, chain);
  auto workers = Workers(2);
  workers[0].eligible = false;  // draining
  uint64_t rr = 0;
  for (Policy p : {Policy::kPrefix, Policy::kRoundRobin, Policy::kLeastLoad, Policy::kSession}) {
    RoutingConfig c;
    c.policy = p;
    ASSERT_OK_AND_ASSIGN(Decision d, Route(c, workers, index, chain, "user-1", &rr));
    EXPECT_EQ(d.worker, 1);
  }
  workers[1].eligible = false;
  EXPECT_THAT(Route({}, workers, index, chain, "", &rr),
              kvserve::testing::StatusIs(absl::StatusCode::kUnavailable,
                                         ::testing::HasSubstr("no worker")));
}

TEST(RoutingPolicyTest, RoundRobinLeastLoadAndSessions) {
  PrefixIndex index;
  auto workers = Workers(3);
  uint64_t rr = 0;
  RoutingConfig c;
  c.policy = Policy::kRoundRobin;
  std::vector<int> picks;
  for (int i = 0; i < 6; ++i) picks.push_back(Route(c, workers, index, {}, "", &rr)->worker);
  EXPECT_EQ(picks, (std::vector<int>{0, 1, 2, 0, 1, 2}));
  c.policy = Policy::kLeastLoad;
  workers[0].waiting = 3;
  workers[1].active_blocks = 10;
  EXPECT_EQ(Route(c, workers, index, {}, "", &rr)->worker, 2);
  // Sessions stick to one worker and spread across workers.
  c.policy = Policy::kSession;
  std::map<int, int> spread;
  for (int u = 0; u < 60; ++u) {
    const std::string key = "user-" + std::to_string(u);
    const int first = Route(c, workers, index, {}, key, &rr)->worker;
    EXPECT_EQ(Route(c, workers, index, {}, key, &rr)->worker, first);
    ++spread[first];
  }
  EXPECT_EQ(spread.size(), 3u);
  EXPECT_THAT(ParsePolicy("random"), kvserve::testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                                                ::testing::HasSubstr("'random'")));
}

}  // namespace
}  // namespace kvserve::router
