// AnswerControl: a served action runs its handler once and its status becomes the reply; any
// other action gets the unserved status; the reply always carries the control's id.
#include "proto/worker_control.h"

#include "gtest/gtest.h"

namespace kvserve {
namespace {

namespace pb = ::kvserve::v1;

pb::Control Make(pb::ControlAction action, uint64_t id) {
  pb::Control c;
  c.set_action(action);
  c.set_control_id(id);
  return c;
}

TEST(WorkerControlTest, AServedActionRunsItsHandlerAndRepliesWithItsStatus) {
  int drains = 0, undrains = 0, unserved = 0;
  const auto unserved_fn = [&](pb::ControlAction) {
    ++unserved;
    return absl::UnimplementedError("no");
  };
  const auto answer = [&](const pb::Control& c) {
    return AnswerControl(c,
                         {{pb::CONTROL_ACTION_DRAIN,
                           [&](const pb::Control&) {
                             ++drains;
                             return absl::OkStatus();
                           }},
                          {pb::CONTROL_ACTION_UNDRAIN,
                           [&](const pb::Control&) {
                             ++undrains;
                             return absl::FailedPreconditionError("cannot be undone");
                           }}},
                         unserved_fn);
  };
  const pb::ControlReply ok = answer(Make(pb::CONTROL_ACTION_DRAIN, 7));
  EXPECT_TRUE(ok.ok());
  EXPECT_EQ(ok.control_id(), 7u);
  EXPECT_FALSE(ok.has_error());
  EXPECT_EQ(drains, 1);

  const pb::ControlReply refused = answer(Make(pb::CONTROL_ACTION_UNDRAIN, 8));
  EXPECT_FALSE(refused.ok());
  EXPECT_EQ(refused.control_id(), 8u);
  EXPECT_EQ(refused.error().code(), static_cast<int>(absl::StatusCode::kFailedPrecondition));
  EXPECT_EQ(refused.error().message(), "cannot be undone");
  EXPECT_EQ(undrains, 1);

  const pb::ControlReply other = answer(Make(pb::CONTROL_ACTION_RECYCLE, 9));
  EXPECT_FALSE(other.ok());
  EXPECT_EQ(other.error().code(), static_cast<int>(absl::StatusCode::kUnimplemented));
  EXPECT_EQ(unserved, 1);
  EXPECT_EQ(drains + undrains, 2) << "no handler ran for an action it does not serve";
}

}  // namespace
}  // namespace kvserve
