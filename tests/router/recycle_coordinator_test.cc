// The recycle coordinator as a pure function: grants within --max-unavailable, lowest name
// first, revokes of held grants beyond it (earliest kept), each revoke once, and the same
// decision for every replica that sees the same workers.
#include "router/recycle_coordinator.h"

#include <algorithm>
#include <random>

#include "gtest/gtest.h"

namespace kvserve::router {
namespace {

namespace pb = ::kvserve::v1;

RecycleView Worker(int id, bool eligible = true) {
  return {
      .id = id, .name = "w" + std::to_string(id), .eligible = eligible, .instance_id = 100u + id};
}

RecycleView Holding(int id, int64_t grant_ms) {
  RecycleView w = Worker(id, /*eligible=*/false);
  w.recycle_pending = true;
  w.recycle_grant_ms = grant_ms;
  return w;
}

RecycleAsk Ask(int id) { return {id, 100u + id, "uptime"}; }

// (worker, action) of each message, in order.
std::vector<std::pair<int, pb::ControlAction>> Actions(const CoordinatorDecision& d) {
  std::vector<std::pair<int, pb::ControlAction>> out;
  for (const auto& [w, c] : d.messages) out.emplace_back(w, c.action());
  return out;
}

TEST(RecycleCoordinatorTest, GrantsUpToTheLimitLowestNameFirstAndDeniesTheRest) {
  const std::vector<RecycleView> workers = {Worker(0), Worker(1), Worker(2), Worker(3)};
  const CoordinatorDecision d = CoordinateRecycles({.max_unavailable = 2, .coordinator_id = "r1"},
                                                   workers, {Ask(3), Ask(1), Ask(2)}, {});
  const std::vector<std::pair<int, pb::ControlAction>> want = {
      {1, pb::CONTROL_ACTION_RECYCLE_GRANT},
      {2, pb::CONTROL_ACTION_RECYCLE_GRANT},
      {3, pb::CONTROL_ACTION_RECYCLE_DENY}};
  EXPECT_EQ(Actions(d), want);
  EXPECT_EQ(d.grants, 2);
  EXPECT_TRUE(d.revoked.empty());
  for (const auto& [w, c] : d.messages) {
    EXPECT_EQ(c.instance_id(), 100u + w);
    EXPECT_EQ(c.coordinator_id(), "r1");
    EXPECT_EQ(c.reason(), "uptime");
  }
}

TEST(RecycleCoordinatorTest, WorkersAlreadyOutOfRotationCountAgainstTheLimit) {
  const std::vector<RecycleView> workers = {Worker(0, /*eligible=*/false), Worker(1), Worker(2)};
  const CoordinatorDecision d =
      CoordinateRecycles({.max_unavailable = 1}, workers, {Ask(1), Ask(2)}, {});
  const std::vector<std::pair<int, pb::ControlAction>> want = {
      {1, pb::CONTROL_ACTION_RECYCLE_DENY}, {2, pb::CONTROL_ACTION_RECYCLE_DENY}};
  EXPECT_EQ(Actions(d), want);
  EXPECT_EQ(d.grants, 0);
}

// A grant this replica sent a moment ago, which the worker's heartbeat does not show yet, holds
// the slot: the next ask is denied, not granted a second slot.
TEST(RecycleCoordinatorTest, GrantsInFlightCountAgainstTheLimit) {
  std::vector<RecycleView> workers = {Worker(0), Worker(1)};
  CoordinatorDecision d = CoordinateRecycles({.max_unavailable = 1}, workers, {Ask(0)}, {});
  ASSERT_EQ(d.grants, 1);
  workers[0].grant_in_flight = true;  // still eligible in the router's view
  d = CoordinateRecycles({.max_unavailable = 1}, workers, {Ask(1)}, {});
  const std::vector<std::pair<int, pb::ControlAction>> want = {
      {1, pb::CONTROL_ACTION_RECYCLE_DENY}};
  EXPECT_EQ(Actions(d), want);
  EXPECT_TRUE(d.revoked.empty()) << "in-flight grants revoke nothing";
}

TEST(RecycleCoordinatorTest, ZeroLimitDeniesEveryAskAndRevokesNothing) {
  const std::vector<RecycleView> workers = {Holding(0, 5), Holding(1, 6), Worker(2)};
  const CoordinatorDecision d = CoordinateRecycles({.max_unavailable = 0}, workers, {Ask(2)}, {});
  const std::vector<std::pair<int, pb::ControlAction>> want = {
      {2, pb::CONTROL_ACTION_RECYCLE_DENY}};
  EXPECT_EQ(Actions(d), want);
}

TEST(RecycleCoordinatorTest, ConcurrentGrantsBeyondTheLimitAreRevokedKeepingTheEarliest) {
  // Two replicas granted w2 and w1 at nearly the same moment; w0 is down for good.
  const std::vector<RecycleView> workers = {Worker(0, /*eligible=*/false), Holding(1, 1005),
                                            Holding(2, 1000), Worker(3)};
  const CoordinatorDecision d = CoordinateRecycles({.max_unavailable = 2}, workers, {}, {});
  const std::vector<std::pair<int, pb::ControlAction>> want = {
      {1, pb::CONTROL_ACTION_RECYCLE_REVOKE}};
  EXPECT_EQ(Actions(d), want);
  EXPECT_EQ(d.revoked, std::vector<std::string>{RevokeKey(101, 1005)});
}

TEST(RecycleCoordinatorTest, EqualGrantTimesKeepTheLowestName) {
  const std::vector<RecycleView> workers = {Holding(2, 7), Holding(1, 7), Worker(0)};
  const CoordinatorDecision d = CoordinateRecycles({.max_unavailable = 1}, workers, {}, {});
  const std::vector<std::pair<int, pb::ControlAction>> want = {
      {2, pb::CONTROL_ACTION_RECYCLE_REVOKE}};
  EXPECT_EQ(Actions(d), want);
}

TEST(RecycleCoordinatorTest, EachGrantIsRevokedOnce) {
  const std::vector<RecycleView> workers = {Holding(1, 10), Holding(2, 20)};
  const CoordinatorDecision first = CoordinateRecycles({.max_unavailable = 1}, workers, {}, {});
  ASSERT_EQ(first.revoked.size(), 1u);
  const absl::flat_hash_set<std::string> sent(first.revoked.begin(), first.revoked.end());
  const CoordinatorDecision again = CoordinateRecycles({.max_unavailable = 1}, workers, {}, sent);
  EXPECT_TRUE(again.messages.empty());
}

TEST(RecycleCoordinatorTest, ReplicasSeeingTheSameWorkersDecideTheSame) {
  std::vector<RecycleView> workers;
  std::vector<RecycleAsk> asks;
  for (int i = 0; i < 8; ++i) {
    workers.push_back(i % 3 == 0 ? Holding(i, 50 - i) : Worker(i, i != 5));
    if (i % 3 != 0) asks.push_back(Ask(i));
  }
  const CoordinatorDecision want = CoordinateRecycles({.max_unavailable = 3}, workers, asks, {});
  std::mt19937 rng(3);
  for (int trial = 0; trial < 10; ++trial) {
    std::shuffle(workers.begin(), workers.end(), rng);
    std::shuffle(asks.begin(), asks.end(), rng);
    const CoordinatorDecision got = CoordinateRecycles({.max_unavailable = 3}, workers, asks, {});
    EXPECT_EQ(Actions(got), Actions(want));
    EXPECT_EQ(got.revoked, want.revoked);
  }
}

}  // namespace
}  // namespace kvserve::router
