// The worker's drain states on a clock the test drives: which drains end the process and how,
// the deadline, the idle grace, and a recycle grant's hold, revoke and commit.
#include "worker/server/drain.h"

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace kvserve::worker {
namespace {

namespace pb = ::kvserve::v1;
using Clock = Drain::Clock;
using ::kvserve::testing::StatusIs;
using std::chrono::milliseconds;

constexpr milliseconds kTimeout{5000}, kHold{1000}, kGrace{200};

class DrainTest : public ::testing::Test {
 protected:
  Drain drain_{kTimeout, kHold, kGrace};
  Clock::time_point t0_ = Clock::now();
};

TEST_F(DrainTest, AdminDrainRefusesWorkButNeverEndsAndCanBeUndone) {
  EXPECT_EQ(drain_.state(), pb::WORKER_STATE_READY);
  EXPECT_TRUE(drain_.Start("admin", /*recycle=*/false, t0_));
  EXPECT_TRUE(drain_.draining());
  EXPECT_EQ(drain_.state(), pb::WORKER_STATE_DRAINING);
  EXPECT_EQ(drain_.reason(), "admin");
  EXPECT_FALSE(drain_.ends());
  EXPECT_EQ(drain_.Finished(t0_ + milliseconds(60000), /*has_work=*/false), std::nullopt);
  EXPECT_FALSE(drain_.Start("again", /*recycle=*/false, t0_));  // no change
  EXPECT_EQ(drain_.reason(), "admin");
  EXPECT_OK(drain_.Undrain());
  EXPECT_EQ(drain_.state(), pb::WORKER_STATE_READY);
}

TEST_F(DrainTest, RecycleEndsOnceIdleForTheGrace) {
  EXPECT_TRUE(drain_.Start("requests", /*recycle=*/true, t0_));
  EXPECT_EQ(drain_.state(), pb::WORKER_STATE_RECYCLING);
  EXPECT_TRUE(drain_.ends());
  EXPECT_THAT(drain_.Undrain(), StatusIs(absl::StatusCode::kFailedPrecondition, ::testing::_));
  EXPECT_EQ(drain_.Finished(t0_, /*has_work=*/true), std::nullopt);
  EXPECT_FALSE(drain_.PastDeadline(t0_ + kTimeout - milliseconds(1)));
  EXPECT_TRUE(drain_.PastDeadline(t0_ + kTimeout));
  const Clock::time_point idle = t0_ + milliseconds(100);
  EXPECT_EQ(drain_.Finished(idle, /*has_work=*/false), std::nullopt);  // idle from now
  EXPECT_EQ(drain_.Finished(idle + kGrace - milliseconds(1), false), std::nullopt);
  EXPECT_EQ(drain_.Finished(idle + kGrace, false), Drain::Exit::kRecycle);
}

TEST_F(DrainTest, WorkInTheGraceRestartsIt) {
  drain_.Start("uptime", /*recycle=*/true, t0_);
  EXPECT_EQ(drain_.Finished(t0_, false), std::nullopt);
  EXPECT_EQ(drain_.Finished(t0_ + milliseconds(150), true), std::nullopt);  // a request came
  EXPECT_EQ(drain_.Finished(t0_ + milliseconds(250), false), std::nullopt);
  EXPECT_EQ(drain_.Finished(t0_ + milliseconds(449), false), std::nullopt);
  EXPECT_EQ(drain_.Finished(t0_ + milliseconds(450), false), Drain::Exit::kRecycle);
}

TEST_F(DrainTest, SigtermWinsOverARecycleAndOverAnAdminDrain) {
  drain_.Start("requests", /*recycle=*/true, t0_);
  EXPECT_TRUE(drain_.Stop(t0_));
  EXPECT_EQ(drain_.state(), pb::WORKER_STATE_DRAINING);
  EXPECT_EQ(drain_.reason(), "requests");  // the drain under way keeps its reason
  EXPECT_FALSE(drain_.Stop(t0_));          // once
  drain_.Finished(t0_, false);
  EXPECT_EQ(drain_.Finished(t0_ + kGrace, false), Drain::Exit::kStopped);

  Drain admin(kTimeout, kHold, kGrace);
  admin.Start("admin", /*recycle=*/false, t0_);
  EXPECT_TRUE(admin.Stop(t0_));
  EXPECT_TRUE(admin.ends());
  EXPECT_THAT(admin.Undrain(), StatusIs(absl::StatusCode::kFailedPrecondition, ::testing::_));
}

TEST_F(DrainTest, SigtermAloneStartsADrainWithItsReasonAndDeadline) {
  const Clock::time_point t = t0_ + milliseconds(700);
  EXPECT_TRUE(drain_.Stop(t));
  EXPECT_EQ(drain_.reason(), "sigterm");
  EXPECT_FALSE(drain_.PastDeadline(t + kTimeout - milliseconds(1)));
  EXPECT_TRUE(drain_.PastDeadline(t + kTimeout));
}

TEST_F(DrainTest, AHeldGrantNeverExitsAndIsRevocableUntilCommitted) {
  drain_.HoldGrant(1234, "router-a", "requests", t0_);
  EXPECT_EQ(drain_.state(), pb::WORKER_STATE_RECYCLING);
  ASSERT_TRUE(drain_.held(t0_).has_value());
  EXPECT_EQ(drain_.held(t0_)->granted_ms, 1234);
  EXPECT_EQ(drain_.held(t0_)->by, "router-a");
  EXPECT_EQ(drain_.Finished(t0_ + milliseconds(900), false), std::nullopt);  // held
  EXPECT_OK(drain_.RevokeGrant("router-b", t0_ + milliseconds(900)));
  EXPECT_EQ(drain_.state(), pb::WORKER_STATE_READY);
  EXPECT_FALSE(drain_.held(t0_ + milliseconds(900)).has_value());
  EXPECT_THAT(drain_.RevokeGrant("router-b", t0_ + milliseconds(900)),
              StatusIs(absl::StatusCode::kFailedPrecondition, ::testing::_));
}

TEST_F(DrainTest, ACommittedGrantCannotBeRevokedAndExits) {
  drain_.HoldGrant(1, "router-a", "requests", t0_);
  EXPECT_FALSE(drain_.held(t0_ + kHold).has_value());
  EXPECT_THAT(drain_.RevokeGrant("router-b", t0_ + kHold),
              StatusIs(absl::StatusCode::kFailedPrecondition, ::testing::_));
  EXPECT_EQ(drain_.Finished(t0_ + kHold, false), std::nullopt);  // idle from now
  EXPECT_EQ(drain_.Finished(t0_ + kHold + kGrace, false), Drain::Exit::kRecycle);
}

TEST_F(DrainTest, ARevokeAfterSigtermKeepsStopping) {
  drain_.HoldGrant(1, "router-a", "requests", t0_);
  drain_.Stop(t0_);
  EXPECT_OK(drain_.RevokeGrant("router-b", t0_ + milliseconds(10)));
  EXPECT_TRUE(drain_.draining());
  EXPECT_EQ(drain_.state(), pb::WORKER_STATE_DRAINING);
  drain_.Finished(t0_ + milliseconds(10), false);
  EXPECT_EQ(drain_.Finished(t0_ + milliseconds(10) + kGrace, false), Drain::Exit::kStopped);
}

TEST_F(DrainTest, AGrantWhileDrainingIsTakenAsHeld) {
  drain_.Start("admin", /*recycle=*/false, t0_);
  drain_.HoldGrant(1, "router-a", "requests", t0_);
  EXPECT_FALSE(drain_.held(t0_).has_value());
  EXPECT_EQ(drain_.reason(), "admin");
}

TEST_F(DrainTest, AnAdminDrainMadeARecycleSaysSo) {
  drain_.Start("admin", /*recycle=*/false, t0_);
  EXPECT_TRUE(drain_.Start("recycle", /*recycle=*/true, t0_));
  EXPECT_EQ(drain_.state(), pb::WORKER_STATE_RECYCLING);
  EXPECT_EQ(drain_.reason(), "admin");
  EXPECT_TRUE(drain_.ends());
}

TEST_F(DrainTest, TheRecycleAskIsLoggedOncePerDenyOrRevoke) {
  EXPECT_TRUE(drain_.AskRecycle());
  EXPECT_FALSE(drain_.AskRecycle());
  drain_.DenyRecycle();
  EXPECT_TRUE(drain_.AskRecycle());
  drain_.HoldGrant(1, "router-a", "requests", t0_);
  ASSERT_OK(drain_.RevokeGrant("router-a", t0_));
  EXPECT_TRUE(drain_.AskRecycle());
}

}  // namespace
}  // namespace kvserve::worker
