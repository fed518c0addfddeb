// Bearer-token checks: API keys for /v1/* and the admin token.
#include "router/auth.h"

#include "gtest/gtest.h"

namespace kvserve::router {
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

}  // namespace
}  // namespace kvserve::router
