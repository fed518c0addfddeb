#include "common/status_macros.h"

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace kvserve {
namespace {

using ::kvserve::testing::StatusIs;

absl::StatusOr<int> Half(int x) {
  if (x % 2 != 0) return absl::InvalidArgumentError("odd");
  return x / 2;
}

int calls = 0;
absl::StatusOr<int> Counted(int x) {
  ++calls;
  return Half(x);
}

absl::StatusOr<int> Quarter(int x) {
  ASSIGN_OR_RETURN(int half, Counted(x));
  ASSIGN_OR_RETURN(half, Counted(half));
  return half;
}

absl::Status Check(int x) {
  RETURN_IF_ERROR(Half(x).status());
  return absl::OkStatus();
}

TEST(StatusMacrosTest, PropagateErrorsAndValues) {
  calls = 0;
  EXPECT_EQ(*Quarter(8), 2);
  EXPECT_EQ(calls, 2);  // each expression evaluated once
  EXPECT_THAT(Quarter(6), StatusIs(absl::StatusCode::kInvalidArgument, "odd"));
  EXPECT_OK(Check(2));
  EXPECT_THAT(Check(3), StatusIs(absl::StatusCode::kInvalidArgument, "odd"));
  EXPECT_THAT(Annotate(absl::NotFoundError("x"), "loading"),
              StatusIs(absl::StatusCode::kNotFound, "loading: x"));
}

}  // namespace
}  // namespace kvserve
