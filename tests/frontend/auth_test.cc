// Bearer-token checks: API keys for /v1/* and the admin token, and reading them from files.
#include "frontend/http/auth.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace kvserve::frontend {
namespace {

TEST(AuthTest, NoKeysLetsEveryoneIn) {
  EXPECT_TRUE(CheckApiKey({}, "").ok());
  EXPECT_TRUE(CheckApiKey({}, "Bearer anything").ok());
}

TEST(AuthTest, OnlyAnExactBearerKeyPasses) {
  const std::vector<std::string> keys = {"k1", "secret-2"};
  EXPECT_TRUE(CheckApiKey(keys, "Bearer k1").ok());
  EXPECT_TRUE(CheckApiKey(keys, "Bearer secret-2").ok());
  for (const char* bad : {"", "k1", "Bearer k", "Bearer k12", "bearer k1", "Bearer  k1", "Basic k1",
                          "Bearer secret-", "Bearer "}) {
    const absl::Status s = CheckApiKey(keys, bad);
    EXPECT_TRUE(absl::IsUnauthenticated(s)) << "'" << bad << "': " << s;
  }
}

TEST(AuthTest, AdminApiIsOffWithoutAToken) {
  EXPECT_TRUE(absl::IsNotFound(CheckAdminToken("", "Bearer ")));
  EXPECT_TRUE(absl::IsNotFound(CheckAdminToken("", "")));
  EXPECT_TRUE(CheckAdminToken("t0ken", "Bearer t0ken").ok());
  EXPECT_TRUE(absl::IsUnauthenticated(CheckAdminToken("t0ken", "Bearer t0ke")));
  EXPECT_TRUE(absl::IsUnauthenticated(CheckAdminToken("t0ken", "")));
}

TEST(AuthTest, KeyFilesTakeCommasNewlinesAndComments) {
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> keys,
                       ParseApiKeys("# team keys\n key-one, key-two\r\n\nkey-three\n", "f"));
  EXPECT_THAT(keys, ::testing::ElementsAre("key-one", "key-two", "key-three"));
  // A key file with no key must not leave the API open.
  EXPECT_THAT(
      ParseApiKeys("# nothing yet\n , \n", "--api-keys-file k"),
      kvserve::testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                 ::testing::HasSubstr("--api-keys-file k holds no API key")));
  EXPECT_EQ(ParseToken("  s3cret\n"), "s3cret");
  EXPECT_EQ(ParseToken("\n"), "");  // the admin API stays off
}

}  // namespace
}  // namespace kvserve::frontend
