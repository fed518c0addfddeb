#include "router/routing/routing_policy.h"

#include <algorithm>
#include <map>
#include <set>

#include "gtest/gtest.h"
#include "router/policies/factory.h"
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
  for (int i = 0; i < n; ++i)
    out.push_back({.id = i, .name = "w" + std::to_string(i), .block_size = 4});
  return out;
}

std::unique_ptr<RoutingPolicy> Make(const std::string& name, RoutingConfig c = {}) {
  c.policy = name;
  absl::StatusOr<std::unique_ptr<RoutingPolicy>> p = MakeRoutingPolicy(c);
  EXPECT_TRUE(p.ok()) << p.status();
  return *std::move(p);
}

RouteRequest Req(absl::Span<const BlockHash> hashes, std::string_view session = "") {
  return {.hashes = hashes,
          .prompt_tokens = static_cast<int64_t>(hashes.size()) * 4,
          .max_tokens = 8,
          .session_key = session};
}

TEST(PrefixPolicyTest, PicksTheWorkerHoldingTheLongestPrefix) {
  PrefixIndex index;
  const auto chain = Chain(10, 1);
  index.RecordRouted(2, absl::MakeSpan(chain).subspan(0, 8));
  index.RecordRouted(1, absl::MakeSpan(chain).subspan(0, 3));
  auto workers = Workers(4);
  auto prefix = Make("prefix");
  ASSERT_OK_AND_ASSIGN(Decision d, Route(*prefix, workers, index, Req(chain)));
  EXPECT_EQ(d.worker, 2);
  EXPECT_EQ(d.reason, RouteReason::kPrefix);
  EXPECT_EQ(d.predicted_cached_blocks, 8);
  // Load weighs in: a busy worker loses to an idle one when its saving is smaller.
  workers[2].active_blocks = 20;
  ASSERT_OK_AND_ASSIGN(d, Route(*prefix, workers, index, Req(chain)));
  EXPECT_EQ(d.worker, 1);
}

TEST(PrefixPolicyTest, FallsBackToLeastLoadedWhenImbalanced) {
  PrefixIndex index;
  const auto chain = Chain(10, 2);
  index.RecordRouted(0, chain);
  auto workers = Workers(3);
  workers[0].active_blocks = 1500;  // spread 1400 > 512 blocks and 1500 > 1.5 × 100
  workers[1].active_blocks = 100;
  workers[2].active_blocks = 800;
  auto prefix = Make("prefix");
  ASSERT_OK_AND_ASSIGN(Decision d, Route(*prefix, workers, index, Req(chain)));
  EXPECT_EQ(d.worker, 1);
  EXPECT_EQ(d.reason, RouteReason::kBalance);
}

TEST(PrefixPolicyTest, NewPrefixesSpreadToTheWorkerCachingLeast) {
  PrefixIndex index;
  index.RecordRouted(0, Chain(10, 1));
  index.RecordRouted(1, Chain(3, 2));
  const auto workers = Workers(3);
  auto prefix = Make("prefix");
  // Nobody caches this prompt: the worker caching least (2, with nothing) gets it.
  ASSERT_OK_AND_ASSIGN(Decision d, Route(*prefix, workers, index, Req(Chain(8, 50))));
  EXPECT_EQ(d.worker, 2);
  EXPECT_EQ(d.reason, RouteReason::kSpread);
  // Three empty workers and three new prompts, each recorded as routed: one each.
  PrefixIndex empty;
  std::set<int> picked;
  for (int i = 0; i < 3; ++i) {
    const auto prompt = Chain(8, 100 + i);
    ASSERT_OK_AND_ASSIGN(Decision e, Route(*prefix, workers, empty, Req(prompt)));
    empty.RecordRouted(e.worker, prompt);
    picked.insert(e.worker);
  }
  EXPECT_EQ(picked.size(), 3u);
  // A prompt half cached somewhere is routed by cost, not spread.
  auto half = Chain(10, 1);
  half.resize(5);
  const auto rest = Chain(5, 77);
  half.insert(half.end(), rest.begin(), rest.end());
  ASSERT_OK_AND_ASSIGN(Decision f, Route(*prefix, workers, index, Req(half)));
  EXPECT_EQ(f.worker, 0);
  EXPECT_EQ(f.reason, RouteReason::kPrefix);
}

TEST(PrefixPolicyTest, CachedPrefixOutweighsModestLoad) {
  // 34-block prompts sharing 32 blocks: the worker holding them keeps the next prompt while it
  // carries up to three such requests more than an idle worker (default weights).
  PrefixIndex index;
  const auto shared = Chain(32, 7);
  index.RecordRouted(1, shared);
  auto prompt = shared;
  const auto question = Chain(2, 99);
  prompt.insert(prompt.end(), question.begin(), question.end());
  auto workers = Workers(2);
  auto prefix = Make("prefix");
  for (int in_flight = 0; in_flight <= 4; ++in_flight) {
    workers[1].active_blocks = 35 * in_flight;
    ASSERT_OK_AND_ASSIGN(Decision d, Route(*prefix, workers, index, Req(prompt)));
    EXPECT_EQ(d.worker, in_flight <= 3 ? 1 : 0) << in_flight << " requests in flight";
  }
}

TEST(RoutingPolicyTest, NeverPicksIneligibleWorkers) {
  PrefixIndex index;
  const auto chain = Chain(4, 3);
  index.RecordRouted(0, chain);
  auto workers = Workers(2);
  workers[0].eligible = false;  // draining
  for (const char* name : {"cost", "prefix", "round_robin", "least_load", "session"}) {
    auto policy = Make(name);
    ASSERT_OK_AND_ASSIGN(Decision d, Route(*policy, workers, index, Req(chain, "user-1")));
    EXPECT_EQ(d.worker, 1) << name;
  }
  workers[1].eligible = false;
  EXPECT_THAT(Route(*Make("cost"), workers, index, Req(chain)),
              kvserve::testing::StatusIs(absl::StatusCode::kUnavailable,
                                         ::testing::HasSubstr("no worker")));
}

TEST(RoutingPolicyTest, RoundRobinLeastLoadAndSessions) {
  PrefixIndex index;
  auto workers = Workers(3);
  auto rr = Make("round_robin");
  std::vector<int> picks;
  for (int i = 0; i < 6; ++i) picks.push_back(Route(*rr, workers, index, Req({}))->worker);
  EXPECT_EQ(picks, (std::vector<int>{0, 1, 2, 0, 1, 2}));
  auto least = Make("least_load");
  workers[0].waiting = 3;
  workers[1].active_blocks = 10;
  EXPECT_EQ(Route(*least, workers, index, Req({}))->worker, 2);
  // Sessions stick to one worker and spread across workers.
  auto session = Make("session");
  std::map<int, int> spread;
  for (int u = 0; u < 60; ++u) {
    const std::string key = "user-" + std::to_string(u);
    const int first = Route(*session, workers, index, Req({}, key))->worker;
    EXPECT_EQ(Route(*session, workers, index, Req({}, key))->worker, first);
    ++spread[first];
  }
  EXPECT_EQ(spread.size(), 3u);
}

TEST(RoutingPolicyTest, UnknownPoliciesAndBadParametersAreRefusedByName) {
  RoutingConfig c;
  c.policy = "random";
  EXPECT_THAT(MakeRoutingPolicy(c),
              kvserve::testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                         ::testing::HasSubstr("'random' is not one of cost")));
  c = {};
  c.new_fraction = 2;
  EXPECT_THAT(MakeRoutingPolicy(c),
              kvserve::testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                         ::testing::HasSubstr("--route-new-fraction")));
  c = {};
  c.fetch_weight = -1;
  EXPECT_THAT(MakeRoutingPolicy(c),
              kvserve::testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                         ::testing::HasSubstr("--route-fetch-weight")));
  c = {};
  c.chunk_tokens = 0;
  EXPECT_THAT(MakeRoutingPolicy(c),
              kvserve::testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                         ::testing::HasSubstr("--route-chunk-tokens")));
}

TEST(CostPolicyTest, PicksTheLongestCachedPrefixWhenLoadsAreEqual) {
  PrefixIndex index;
  const auto chain = Chain(10, 1);
  index.RecordRouted(2, absl::MakeSpan(chain).subspan(0, 8));
  index.RecordRouted(1, absl::MakeSpan(chain).subspan(0, 3));
  const auto workers = Workers(4);
  ASSERT_OK_AND_ASSIGN(Decision d, Route(*Make("cost"), workers, index, Req(chain)));
  EXPECT_EQ(d.worker, 2);
  EXPECT_EQ(d.reason, RouteReason::kPrefix);
  EXPECT_EQ(d.predicted_cached_blocks, 8);
}

TEST(CostPolicyTest, AHotWorkerIsShedOnlyWhenItsQueueOutweighsItsCache) {
  // Worker 1 caches 32 of a 40-block prompt (128 of 160 tokens): it saves 128 tokens of
  // prefill, counted three times (--route-miss-weight 3), so it keeps the prompt until 384 more
  // tokens are queued on it than elsewhere.
  PrefixIndex index;
  const auto prompt = Chain(40, 5);
  index.RecordRouted(1, absl::MakeSpan(prompt).subspan(0, 32));
  auto workers = Workers(3);
  auto cost = Make("cost");
  for (int64_t queued : {0, 100, 383, 385, 1000}) {
    workers[1].queued_prefill_tokens = queued;
    ASSERT_OK_AND_ASSIGN(Decision d, Route(*cost, workers, index, Req(prompt)));
    if (queued < 384) {
      EXPECT_EQ(d.worker, 1) << queued;
      EXPECT_EQ(d.reason, RouteReason::kPrefix);
    } else {
      EXPECT_NE(d.worker, 1) << queued;
      EXPECT_EQ(d.reason, RouteReason::kBalance);
    }
  }
}

TEST(CostPolicyTest, APeerFetchCountsAtItsTransferTimeInsteadOfAMiss) {
  // Worker 1 caches 32 of a 40-block prompt; worker 0 could pull those 32 blocks from it in the
  // time it prefills 20 tokens. Counted three times (--route-fetch-weight 3), worker 0 costs
  // 3 · 32 + 3 · 20 = 156 and worker 1 its queue + 3 · 32: it keeps the prompt below 60 queued
  // tokens, where without the offer it would keep it below 384.
  PrefixIndex index;
  const auto prompt = Chain(40, 9);
  index.RecordRouted(1, absl::MakeSpan(prompt).subspan(0, 32));
  auto workers = Workers(3);
  const std::vector<FetchOffer> offers = {{.blocks = 32, .cost_tokens = 20}};
  RouteRequest with_fetch = Req(prompt);
  with_fetch.fetch_offers = offers;
  auto cost = Make("cost");
  for (int64_t queued : {0, 59, 61, 300}) {
    workers[1].queued_prefill_tokens = queued;
    ASSERT_OK_AND_ASSIGN(Decision d, Route(*cost, workers, index, with_fetch));
    EXPECT_EQ(d.worker, queued < 60 ? 1 : 0) << queued;
    EXPECT_EQ(d.reason, queued < 60 ? RouteReason::kPrefix : RouteReason::kBalance);
    EXPECT_EQ(Route(*cost, workers, index, Req(prompt))->worker, 1) << "no offer: " << queued;
  }
  // At weight 1 the transfer counts once: 96 + 20 = 116, so worker 1 keeps it below 20.
  RoutingConfig once;
  once.fetch_weight = 1;
  auto light = Make("cost", once);
  workers[1].queued_prefill_tokens = 21;
  EXPECT_EQ(Route(*light, workers, index, with_fetch)->worker, 0);
  workers[1].queued_prefill_tokens = 19;
  EXPECT_EQ(Route(*light, workers, index, with_fetch)->worker, 1);
}

TEST(CostPolicyTest, DecodeLoadAndKvPressureCount) {
  PrefixIndex index;
  const auto prompt = Chain(10, 6);
  auto workers = Workers(2);
  auto cost = Make("cost");
  // Equal caches (none): the worker running fewer decodes starts the prompt sooner.
  workers[0].decode_seqs = 64;
  EXPECT_EQ(Route(*cost, workers, index, Req(prompt))->worker, 1);
  EXPECT_EQ(Route(*cost, workers, index, Req(prompt))->worker, 1);
  // A worker whose pool its requests in flight fill would wait: the other one is cheaper.
  workers[0].decode_seqs = 0;
  workers[1].capacity_blocks = 20;
  workers[1].active_blocks = 18;
  EXPECT_EQ(Route(*cost, workers, index, Req(prompt))->worker, 0);
  EXPECT_EQ(Route(*cost, workers, index, Req(prompt))->worker, 0);
}

TEST(CostPolicyTest, HostTierHitsCountAtTheirOnboardingCost) {
  PrefixIndex index;
  const auto prompt = Chain(10, 8);
  // Worker 0 holds 8 blocks on the host tier, worker 1 six on the device.
  kvserve::v1::KvEventBatch batch;
  batch.set_seq(1);
  batch.set_instance_id(1);
  kvserve::v1::BlockStored* stored = batch.add_events()->mutable_stored();
  stored->set_medium(kvserve::v1::MEDIUM_HOST);
  for (int i = 0; i < 8; ++i) stored->add_block_hashes(prompt[i].ToBytes());
  ASSERT_EQ(index.ApplyEvents(0, batch), PrefixIndex::Apply::kApplied);
  index.RecordRouted(1, absl::MakeSpan(prompt).subspan(0, 6));
  const auto workers = Workers(2);
  RoutingConfig c;
  c.host_cost = 0.1;  // 8 host blocks save 7.2 blocks of prefill: more than 6 on the device
  EXPECT_EQ(Route(*Make("cost", c), workers, index, Req(prompt))->worker, 0);
  c.host_cost = 0.5;  // they save 4: less
  EXPECT_EQ(Route(*Make("cost", c), workers, index, Req(prompt))->worker, 1);
}

// A scenario of workers with caches and loads and a list of prompts, built at a scale: every
// size in tokens (block size, queued prefill, output) multiplied by `scale`.
std::vector<int> ScenarioDecisions(int scale, bool reversed) {
  PrefixIndex index;
  std::vector<std::vector<BlockHash>> prompts;
  for (int p = 0; p < 24; ++p) prompts.push_back(Chain(6 + (p * 7) % 30, 200 + p % 6));
  std::vector<WorkerView> workers;
  for (int i = 0; i < 5; ++i) {
    workers.push_back({.id = i,
                       .name = "w" + std::to_string(i),
                       .active_blocks = (i * 13) % 40,
                       .queued_prefill_tokens = int64_t{(i * 37) % 90} * scale,
                       .decode_seqs = (i * 11) % 50,
                       .capacity_blocks = 60,
                       .block_size = 4 * scale});
    index.RecordRouted(i, absl::MakeSpan(prompts[i * 3]).subspan(0, 4 + i));
  }
  if (reversed) std::reverse(workers.begin(), workers.end());
  auto cost = Make("cost");
  std::vector<int> picks;
  for (const auto& hashes : prompts) {
    const RouteRequest r{.hashes = hashes,
                         .prompt_tokens = static_cast<int64_t>(hashes.size()) * 4 * scale,
                         .max_tokens = 8 * scale};
    absl::StatusOr<Decision> d = Route(*cost, workers, index, r);
    picks.push_back(d.ok() ? d->worker : -1);
    for (WorkerView& w : workers) {
      if (w.id == picks.back()) w.queued_prefill_tokens += r.prompt_tokens / 2;
    }
    index.RecordRouted(picks.back(), hashes);
  }
  return picks;
}

TEST(CostPolicyTest, DoublingEverySizeChangesNoDecision) {
  const std::vector<int> base = ScenarioDecisions(1, false);
  EXPECT_EQ(ScenarioDecisions(2, false), base);
  EXPECT_EQ(ScenarioDecisions(8, false), base);
  EXPECT_EQ(std::set<int>(base.begin(), base.end()).size(), 5u) << "the scenario uses them all";
}

TEST(CostPolicyTest, NewConversationsSpreadEvenlyWhateverTheWorkerOrder) {
  // 8 idle workers, 64 new conversations that share one system-prompt block (under
  // new_fraction of each), each recorded where it went: 8 each, in either listing order.
  for (bool reversed : {false, true}) {
    PrefixIndex index;
    auto workers = Workers(8);
    if (reversed) std::reverse(workers.begin(), workers.end());
    auto cost = Make("cost");
    const auto system = Chain(1, 900);
    std::map<int, int> per_worker;
    for (int c = 0; c < 64; ++c) {
      auto prompt = system;
      const auto own = Chain(20, 1000 + c);
      prompt.insert(prompt.end(), own.begin(), own.end());
      ASSERT_OK_AND_ASSIGN(Decision d, Route(*cost, workers, index, Req(prompt)));
      ++per_worker[d.worker];
      index.RecordRouted(d.worker, prompt);
      if (c > 0) {
        EXPECT_EQ(d.reason, RouteReason::kSpread);
      }
    }
    ASSERT_EQ(per_worker.size(), 8u);
    for (const auto& [w, n] : per_worker) EXPECT_EQ(n, 8) << "worker " << w;
  }
}

TEST(CostPolicyTest, ReplicasKeepNewConversationsApartWithRandomDraws) {
  // Two replicas see the same idle workers and get a new conversation each at the same instant.
  // Deterministic, they pick the same worker; with other_replicas set, each takes the better of
  // two random draws, and they collide about one time in eight.
  PrefixIndex index;
  const auto workers = Workers(8);
  const auto prompt = Chain(20, 77);
  int same_deterministic = 0, same_drawn = 0;
  for (uint64_t trial = 0; trial < 100; ++trial) {
    auto a = Make("cost", {.seed = 2 * trial + 1}), b = Make("cost", {.seed = 2 * trial + 2});
    ASSERT_OK_AND_ASSIGN(Decision da, Route(*a, workers, index, Req(prompt)));
    ASSERT_OK_AND_ASSIGN(Decision db, Route(*b, workers, index, Req(prompt)));
    same_deterministic += da.worker == db.worker;
    RouteRequest r = Req(prompt);
    r.other_replicas = true;
    ASSERT_OK_AND_ASSIGN(da, Route(*a, workers, index, r));
    ASSERT_OK_AND_ASSIGN(db, Route(*b, workers, index, r));
    EXPECT_EQ(da.reason, RouteReason::kSpread);
    same_drawn += da.worker == db.worker;
  }
  EXPECT_EQ(same_deterministic, 100);
  EXPECT_LT(same_drawn, 30);
}

TEST(CostPolicyTest, ADrawnBusyWorkerLosesToTheOtherDraw) {
  PrefixIndex index;
  auto workers = Workers(8);
  workers[3].queued_prefill_tokens = 100000;
  auto cost = Make("cost", {.seed = 7});
  RouteRequest r = Req(Chain(20, 5));
  r.other_replicas = true;
  for (int i = 0; i < 200; ++i) {
    ASSERT_OK_AND_ASSIGN(Decision d, Route(*cost, workers, index, r));
    EXPECT_NE(d.worker, 3);
  }
  // 0: the best of all, as with one replica.
  auto all = Make("cost", {.spread_choices = 0, .seed = 7});
  ASSERT_OK_AND_ASSIGN(Decision d, Route(*all, workers, index, r));
  EXPECT_NE(d.worker, 3);
  EXPECT_FALSE(MakeRoutingPolicy({.spread_choices = -1}).ok());
}

}  // namespace
}  // namespace kvserve::router
