// GoogleTest matchers for absl::Status and absl::StatusOr (Debian's Abseil ships none).
//
//   EXPECT_THAT(DoThing(), IsOk());
//   EXPECT_THAT(Parse("x"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'x'")));
//   ASSERT_OK_AND_ASSIGN(auto value, MakeValue());
#ifndef KVSERVE_TESTS_TESTING_STATUS_MATCHERS_H_
#define KVSERVE_TESTS_TESTING_STATUS_MATCHERS_H_

#include <ostream>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvserve::testing {

inline const absl::Status& GetStatus(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& s) {
  return s.status();
}

MATCHER(IsOk, negation ? "is not OK" : "is OK") {
  const absl::Status& s = GetStatus(arg);
  if (!s.ok()) *result_listener << "status is " << s.ToString();
  return s.ok();
}

MATCHER_P2(StatusIs, code, message_matcher,
           "has code " + absl::StatusCodeToString(code) + " and a message that " +
               ::testing::DescribeMatcher<std::string>(message_matcher, negation)) {
  const absl::Status& s = GetStatus(arg);
  *result_listener << "status is " << s.ToString();
  return s.code() == code &&
         ::testing::Matches(message_matcher)(std::string(s.message().data(), s.message().size()));
}

}  // namespace kvserve::testing

namespace absl {
// Prints a StatusOr as its status (or "OK: <value>") instead of its bytes.
template <typename T>
void PrintTo(const StatusOr<T>& s, std::ostream* os) {
  if (s.ok()) {
    *os << "OK: " << ::testing::PrintToString(*s);
  } else {
    *os << s.status().ToString();
  }
}
}  // namespace absl

#define KVSERVE_TEST_CONCAT_INNER_(a, b) a##b
#define KVSERVE_TEST_CONCAT_(a, b) KVSERVE_TEST_CONCAT_INNER_(a, b)
#define ASSERT_OK(expr) ASSERT_THAT((expr), ::kvserve::testing::IsOk())
#define EXPECT_OK(expr) EXPECT_THAT((expr), ::kvserve::testing::IsOk())
#define ASSERT_OK_AND_ASSIGN(lhs, rexpr) \
  ASSERT_OK_AND_ASSIGN_IMPL_(KVSERVE_TEST_CONCAT_(statusor_, __LINE__), lhs, rexpr)
#define ASSERT_OK_AND_ASSIGN_IMPL_(statusor, lhs, rexpr)      \
  auto statusor = (rexpr);                                    \
  ASSERT_THAT(statusor.status(), ::kvserve::testing::IsOk()); \
  lhs = std::move(statusor).value()

#endif  // KVSERVE_TESTS_TESTING_STATUS_MATCHERS_H_
