// The front's flags: --api-threads takes 0..256, and 0 (the handlers on the sockets' thread) is
// refused beside a Redis --responses-store, whose round trips would hold up every stream.
#include "frontend/http/front_flags.h"

#include <string>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

ABSL_DECLARE_FLAG(int32_t, api_threads);
ABSL_DECLARE_FLAG(std::string, responses_store);

namespace kvserve::frontend {
namespace {

using ::testing::HasSubstr;

absl::Status FromFlags(int api_threads, const std::string& store) {
  absl::SetFlag(&FLAGS_api_threads, api_threads);
  absl::SetFlag(&FLAGS_responses_store, store);
  FrontOptions f;
  Admission a;
  return FrontFromFlags(4096, &f, &a);
}

TEST(FrontFlagsTest, ApiThreadsZeroRunsBesideTheEmbeddedStoreOnly) {
  EXPECT_TRUE(FromFlags(0, "memory").ok());
  EXPECT_TRUE(FromFlags(0, "none").ok());
  EXPECT_TRUE(FromFlags(2, "redis://127.0.0.1:6379").ok());  // the store is not dialled here
  const absl::Status s = FromFlags(0, "redis://127.0.0.1:6379");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("--api-threads 0"));
  EXPECT_THAT(s.message(), HasSubstr("--responses-store"));
}

TEST(FrontFlagsTest, ApiThreadsOutOfRangeAreRefusedByName) {
  for (const int n : {-1, 257}) {
    const absl::Status s = FromFlags(n, "memory");
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << n;
    EXPECT_THAT(s.message(), HasSubstr("--api-threads")) << n;
  }
}

}  // namespace
}  // namespace kvserve::frontend
