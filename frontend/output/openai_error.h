// Errors as OpenAI's API answers them: an HTTP status and the body
// {"error": {"message", "type", "param", "code"}}. Every error the HTTP front end sends is
// built here.
//
//   OpenAiError e = OpenAiErrorFromStatus(absl::InvalidArgumentError("top_p: must be <= 1"));
//   // e.http_status == 400, e.json names "top_p" as the param
#ifndef KVSERVE_FRONTEND_OUTPUT_OPENAI_ERROR_H_
#define KVSERVE_FRONTEND_OUTPUT_OPENAI_ERROR_H_

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "nlohmann/json.hpp"

namespace kvserve::frontend {

// A response body's text: compact JSON, invalid UTF-8 in strings replaced (never an exception).
std::string JsonBody(const nlohmann::json& j);
// The same with keys in insertion order.
std::string OrderedJsonBody(const nlohmann::ordered_json& j);

struct OpenAiError {
  int http_status = 400;
  std::string json;
};

// The error of `http_status` with this type ("invalid_request_error", "authentication_error",
// "not_found", ...); an empty `code` or `param` is null.
OpenAiError MakeOpenAiError(int http_status, std::string_view type, std::string_view message,
                            std::string_view code = "", std::string_view param = "");

// The error for a status: InvalidArgument → 400 invalid_request_error, with the param taken
// from the message's "param: " prefix; Unauthenticated → 401 authentication_error; NotFound →
// 404; ResourceExhausted → 429 rate_limit_error; Unavailable and FailedPrecondition → 503
// service_unavailable; anything else → 500 internal_error.
OpenAiError OpenAiErrorFromStatus(const absl::Status& status, std::string_view code = "");

}  // namespace kvserve::frontend

#endif  // KVSERVE_FRONTEND_OUTPUT_OPENAI_ERROR_H_
