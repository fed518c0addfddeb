#include "tests/frontend/request_test_util.h"

#include "frontend/output/openai_error.h"
#include "frontend/request/openai_request.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace kvserve::frontend::testing {

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

}  // namespace kvserve::frontend::testing
