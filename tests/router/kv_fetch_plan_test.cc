// PlanFetch (router/kv_fetch.h): which peer a worker pulls a prompt's prefix from, and when a
// fetch is not worth it or not possible.
#include <algorithm>
#include <optional>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "router/kv_fetch.h"

namespace kvserve::router {
namespace {

std::vector<BlockHash> Hashes(int n) {
  std::vector<BlockHash> out;
  for (int i = 0; i < n; ++i) {
    std::vector<uint32_t> tokens(16, static_cast<uint32_t>(i + 1));
    out.push_back(HashBlock(i == 0 ? nullptr : &out.back(), tokens, "key"));
  }
  return out;
}

WorkerView View(int id, double prefill_rate = 0, int64_t wire_bytes = 4096) {
  WorkerView v;
  v.id = id;
  v.name = "w" + std::to_string(id);
  v.block_size = 16;
  v.kv_wire_block_bytes = wire_bytes;
  v.prefill_tokens_per_second = prefill_rate;
  return v;
}

class PlanFetchTest : public ::testing::Test {
 protected:
  // Worker 0 caches the first 2 blocks, worker 1 the first 10, worker 2 the first 7.
  void SetUp() override {
    index_.RecordRouted(0, absl::MakeConstSpan(hashes_).first(2));
    index_.RecordRouted(1, hashes_);
    index_.RecordRouted(2, absl::MakeConstSpan(hashes_).first(7));
    views_ = {View(0, 10000), View(1, 20000), View(2, 20000)};
  }
  std::optional<FetchPlan> Plan(int to) {
    return PlanFetch(config_, /*gbps=*/1.0, views_, index_, hashes_, to);
  }

  KvFetchConfig config_{.enabled = true, .min_blocks = 4};
  std::vector<BlockHash> hashes_ = Hashes(10);
  PrefixIndex index_;
  std::vector<WorkerView> views_;
};

TEST_F(PlanFetchTest, TheFurthestReachingPeerSendsWhatTheTargetLacks) {
  std::optional<FetchPlan> p = Plan(0);
  ASSERT_TRUE(p);
  EXPECT_EQ(p->source, 1);
  EXPECT_EQ(p->first_block, 2);
  EXPECT_EQ(p->blocks, 8);
  EXPECT_DOUBLE_EQ(p->transfer_s, 8 * 4096 / 1e9);
  EXPECT_DOUBLE_EQ(p->prefill_s, 8 * 16 / 10000.0) << "the target's own prefill rate";
}

TEST_F(PlanFetchTest, ADrainingPeerStillServesItsCacheButASilentOneDoesNot) {
  views_[1].eligible = false;  // draining: fresh, not routed to
  ASSERT_TRUE(Plan(0));
  EXPECT_EQ(Plan(0)->source, 1);
  views_[1].fresh = false;  // its heartbeat stopped
  ASSERT_TRUE(Plan(0));
  EXPECT_EQ(Plan(0)->source, 2) << "the next furthest";
}

TEST_F(PlanFetchTest, NoPlanWhenItIsNotWorthItOrNotPossible) {
  config_.min_blocks = 9;  // worker 1 has 8 more
  EXPECT_FALSE(Plan(0));
  config_.min_blocks = 4;
  EXPECT_FALSE(PlanFetch(config_, /*gbps=*/1e-6, views_, index_, hashes_, 0))
      << "a link slower than prefilling";
  EXPECT_FALSE(Plan(1)) << "nobody caches more than worker 1";
  views_[1].kv_wire_block_bytes = views_[2].kv_wire_block_bytes = 2048;
  EXPECT_FALSE(Plan(0)) << "blocks of another size on the wire";
  views_[0].kv_wire_block_bytes = 0;
  EXPECT_FALSE(Plan(0)) << "a target that moves no KV (an OpenAI upstream)";
  config_.enabled = false;
  EXPECT_FALSE(Plan(0));
}

TEST_F(PlanFetchTest, BeforeTheTargetMeasuredItsPrefillTheFastestPeerRateStandsIn) {
  views_[0].prefill_tokens_per_second = 0;
  std::optional<FetchPlan> p = Plan(0);
  ASSERT_TRUE(p);
  EXPECT_DOUBLE_EQ(p->prefill_s, 8 * 16 / 20000.0);
  for (WorkerView& v : views_) v.prefill_tokens_per_second = 0;
  EXPECT_FALSE(Plan(0)) << "nothing measured: no fetch";
}

// The offers the cost policy weighs: each eligible worker's plan, its transfer time in its own
// prompt tokens; none for a worker not routed to, or with fetching out of the policy.
TEST_F(PlanFetchTest, OffersAreEachEligibleWorkersPlanInItsPromptTokens) {
  views_[2].eligible = false;  // draining: a source, never a target
  std::vector<FetchOffer> offers = FetchOffers(config_, /*gbps=*/1.0, views_, index_, hashes_);
  ASSERT_EQ(offers.size(), 1u) << "only worker 0 has a plan";
  EXPECT_EQ(offers[0].blocks, Plan(0)->blocks);
  // 8 blocks of 16 tokens, moved in 8 · 4096 B / 1 GB/s against 128 tokens at 10,000 per second.
  EXPECT_DOUBLE_EQ(offers[0].cost_tokens, 128 * (8 * 4096 / 1e9) / (128 / 10000.0));
  views_[0].eligible = false;
  EXPECT_TRUE(FetchOffers(config_, 1.0, views_, index_, hashes_).empty());
  views_[0].eligible = true;
  config_.in_policy = false;
  EXPECT_TRUE(FetchOffers(config_, 1.0, views_, index_, hashes_).empty());
}

// Across a fleet of mixed wire sizes, silent workers, unmeasured rates and ties, every worker's
// plan is the one the contract names: the first (in view order) of the fresh peers of its wire
// size whose device prefix reaches furthest, when far enough and worth the transfer. The plans
// are built from each wire size's best two senders (one pass over the workers, not one per
// target); this compares them with asking every peer for every target.
TEST(FetchOffersTest, EveryPlanIsTheFurthestReachingPeerAcrossAFleet) {
  std::mt19937 rng(11);
  const std::vector<BlockHash> hashes = Hashes(24);
  for (int round = 0; round < 20; ++round) {
    PrefixIndex index;
    std::vector<WorkerView> views;
    for (int w = 0; w < 40; ++w) {
      const int held = std::uniform_int_distribution<int>(0, 24)(rng) / 3 * 3;  // ties
      if (held > 0) index.RecordRouted(w, absl::MakeConstSpan(hashes).first(held));
      const double rate = rng() % 4 == 0 ? 0 : 5000.0 * (1 + rng() % 4);
      views.push_back(View(w, rate, rng() % 3 == 0 ? 8192 : 4096));
      views.back().fresh = rng() % 5 != 0;
      views.back().eligible = views.back().fresh && rng() % 4 != 0;
    }
    const KvFetchConfig config{.enabled = true, .min_blocks = 3};
    const std::vector<FetchOffer> offers = FetchOffers(config, /*gbps=*/0.5, views, index, hashes);
    for (size_t t = 0; t < views.size(); ++t) {
      const WorkerView& target = views[t];
      double rate = target.prefill_tokens_per_second;
      for (const WorkerView& v : views) {
        if (rate == 0 && v.kv_wire_block_bytes == target.kv_wire_block_bytes) {
          rate = std::max(rate, v.prefill_tokens_per_second);
        }
      }
      const int have = index.LongestPrefix(target.id, hashes).total();
      int source = -1, more = 0;
      for (const WorkerView& v : views) {
        if (v.id == target.id || !v.fresh || v.kv_wire_block_bytes != target.kv_wire_block_bytes)
          continue;
        const int m = index.LongestPrefix(v.id, hashes).device_blocks - have;
        if (m >= config.min_blocks && m > more) source = v.id, more = m;
      }
      const bool worth =
          source >= 0 && rate > 0 && more * target.kv_wire_block_bytes / 0.5e9 < more * 16 / rate;
      const std::optional<FetchPlan> plan = PlanFetch(config, 0.5, views, index, hashes, target.id);
      SCOPED_TRACE(absl::StrCat("round ", round, ", worker ", t));
      ASSERT_EQ(plan.has_value(), worth);
      const bool offered = t < offers.size() && offers[t].blocks > 0;
      EXPECT_EQ(offered, worth && target.eligible);
      if (!worth) continue;
      EXPECT_EQ(plan->source, source);
      EXPECT_EQ(plan->blocks, more);
      EXPECT_EQ(plan->first_block, have);
    }
  }
}

}  // namespace
}  // namespace kvserve::router
