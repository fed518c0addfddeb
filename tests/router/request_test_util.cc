#include "tests/router/request_test_util.h"

#include "gtest/gtest.h"
#include "router/openai_error.h"
#include "router/openai_request.h"
#include "tests/testing/status_matchers.h"

namespace kvserve::router::testing {

using json = nlohmann::json;

json MinimalBody(bool chat) {
  return chat ? json{{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "x"}}}}}
              : json{{"model", "m"}, {"prompt", "x"}};
}

void ExpectParam(const json& extra, bool chat, const char* param) {
  json body = MinimalBody(chat);
  body.update(extra);
  absl::StatusOr<ParsedRequest> r = ParseCompletionRequest(body.dump(), chat);
  if (param == nullptr) {
    EXPECT_OK(r.status()) << body;
    return;
  }
  ASSERT_THAT(r, kvserve::testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                            ::testing::HasSubstr(param)))
      << body;
  EXPECT_EQ(json::parse(OpenAiErrorFromStatus(r.status()).json)["error"]["param"], param)
      << r.status();
}

}  // namespace kvserve::router::testing
