// The worker's load report: what it says of the engine's load, the placements it has seen per
// router replica (the last, never going back), the bound on replicas, and when it changed.
#include "worker/server/load_reports.h"

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace kvserve::worker {
namespace {

namespace pb = ::kvserve::v1;

uint64_t SeenFor(const pb::LoadReport& r, const std::string& router_id) {
  for (const pb::PlacementsSeen& s : r.seen()) {
    if (s.router_id() == router_id) return s.placement();
  }
  return 0;
}

TEST(LoadReportsTest, ReportsTheLoadAndTheLastPlacementPerReplica) {
  LoadReports reports;
  reports.Took("a/1", 1, 1000);
  reports.Took("a/1", 3, 2000);
  reports.Took("a/1", 2, 3000);  // late or replayed: the report already counts it
  reports.Took("b/7", 5, 1000);
  reports.Took("", 9, 1000);  // unnumbered: an older router, or the worker's own front
  reports.Took("c/2", 0, 1000);
  const Engine::Load load{
      .prefill_tokens = 300, .decode_seqs = 4, .reserved_blocks = 20, .requests = 5, .waiting = 1};
  pb::WorkerStatus st;
  reports.Fill(load, st.mutable_load_report());
  // Through the wire, as routers read it.
  pb::WorkerStatus parsed;
  ASSERT_TRUE(parsed.ParseFromString(st.SerializeAsString()));
  const pb::LoadReport& r = parsed.load_report();
  EXPECT_EQ(r.prefill_tokens(), 300);
  EXPECT_EQ(r.decode_seqs(), 4);
  EXPECT_EQ(r.reserved_blocks(), 20);
  EXPECT_EQ(r.requests(), 5);
  EXPECT_EQ(r.waiting(), 1);
  EXPECT_EQ(r.seen_size(), 2);
  EXPECT_EQ(SeenFor(r, "a/1"), 3u);
  EXPECT_EQ(SeenFor(r, "b/7"), 5u);
  for (const pb::PlacementsSeen& seen : r.seen()) {
    EXPECT_EQ(seen.at_ms(), seen.router_id() == "a/1" ? 2000 : 1000);  // when it last advanced
  }
}

TEST(LoadReportsTest, ChangedWhenTheLoadOrThePlacementsSeenMoved) {
  LoadReports reports;
  const Engine::Load idle;
  EXPECT_FALSE(reports.Changed(idle));
  pb::LoadReport r;
  reports.Fill(idle, &r);
  EXPECT_FALSE(reports.Changed(idle));
  reports.Took("a/1", 1, 1000);
  EXPECT_TRUE(reports.Changed(idle));  // a placement refused at once changes no load
  reports.Fill(idle, &r);
  EXPECT_FALSE(reports.Changed(idle));
  EXPECT_TRUE(reports.Changed({.prefill_tokens = 10}));
  EXPECT_TRUE(reports.Changed({.decode_seqs = 1}));
  EXPECT_TRUE(reports.Changed({.reserved_blocks = 1}));
  EXPECT_TRUE(reports.Changed({.requests = 1}));
  EXPECT_TRUE(reports.Changed({.waiting = 1}));
  reports.Took("a/1", 1, 1000);  // not past the last: nothing new
  EXPECT_FALSE(reports.Changed(idle));
}

TEST(LoadReportsTest, ForgetsTheReplicaHeardFromLeastRecentlyPastTheBound) {
  LoadReports reports;
  for (size_t i = 0; i < LoadReports::kMaxReplicas; ++i) {
    reports.Took(absl::StrCat("r", i), 1, 1000);
  }
  reports.Took("r0", 2, 1000);   // r0 is heard from again: r1 is now the oldest
  reports.Took("new", 1, 1000);  // one past the bound
  pb::LoadReport r;
  reports.Fill({}, &r);
  EXPECT_EQ(static_cast<size_t>(r.seen_size()), LoadReports::kMaxReplicas);
  EXPECT_EQ(SeenFor(r, "r0"), 2u);
  EXPECT_EQ(SeenFor(r, "r1"), 0u);
  EXPECT_EQ(SeenFor(r, "new"), 1u);
}

}  // namespace
}  // namespace kvserve::worker
