#include "frontend/output/openai_error.h"

#include "nlohmann/json.hpp"

namespace kvserve::frontend {
namespace {

// The "param: what is wrong" prefix of an InvalidArgument message (ParseCompletionRequest's
// form), or "" when the message has none.
std::string ParamOf(const std::string& message) {
  const size_t colon = message.find(": ");
  if (colon == std::string::npos || message.find(' ') < colon) return "";
  return message.substr(0, colon);
}

}  // namespace

std::string JsonBody(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string OrderedJsonBody(const nlohmann::ordered_json& j) {
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

OpenAiError MakeOpenAiError(int http_status, std::string_view type, std::string_view message,
                            std::string_view code, std::string_view param) {
  nlohmann::json err = {{"message", std::string(message)},
                        {"type", std::string(type)},
                        {"param", nullptr},
                        {"code", nullptr}};
  if (!param.empty()) err["param"] = std::string(param);
  if (!code.empty()) err["code"] = std::string(code);
  return {http_status, JsonBody(nlohmann::json{{"error", err}})};
}

OpenAiError OpenAiErrorFromStatus(const absl::Status& status, std::string_view code) {
  const std::string message(status.message());
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
      return MakeOpenAiError(400, "invalid_request_error", message, code, ParamOf(message));
    case absl::StatusCode::kUnauthenticated:
      return MakeOpenAiError(401, "authentication_error", message, code);
    case absl::StatusCode::kNotFound:
      return MakeOpenAiError(404, "invalid_request_error", message, code);
    case absl::StatusCode::kResourceExhausted:
      return MakeOpenAiError(429, "rate_limit_error", message, code);
    case absl::StatusCode::kDeadlineExceeded:
      return MakeOpenAiError(504, "timeout", message, code);
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kFailedPrecondition:
      return MakeOpenAiError(503, "service_unavailable", message, code);
    default:
      return MakeOpenAiError(500, "internal_error", message, code);
  }
}

}  // namespace kvserve::frontend
