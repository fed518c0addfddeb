#include "frontend/output/messages_output.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace kvserve::frontend {

using json = nlohmann::json;

namespace {

// Anthropic's error type for an HTTP status.
const char* ErrorType(int status) {
  switch (status) {
    case 400:
    case 413:
    case 422:
      return "invalid_request_error";
    case 401:
      return "authentication_error";
    case 403:
      return "permission_error";
    case 404:
      return "not_found_error";
    case 429:
      return "rate_limit_error";
    case 503:
    case 529:
      return "overloaded_error";
    default:
      return "api_error";
  }
}

// The error object of an OpenAI error body.
json ErrorObject(const OpenAiError& error) {
  const json body = json::parse(error.json, nullptr, false);
  const json* e = body.is_object() && body.contains("error") && body["error"].is_object()
                      ? &body["error"]
                      : nullptr;
  std::string message = "the request failed";
  if (e != nullptr && e->contains("message") && (*e)["message"].is_string()) {
    message = (*e)["message"].get<std::string>();
  }
  return {{"type", ErrorType(error.http_status)}, {"message", std::move(message)}};
}

}  // namespace

OpenAiError AnthropicError(const OpenAiError& error) {
  return {error.http_status, json{{"type", "error"}, {"error", ErrorObject(error)}}.dump()};
}

void MessagesOutput::Begin(std::string id, int64_t /*created*/, std::string model) {
  id_ = absl::StrCat("msg_", id);
  model_ = std::move(model);
}

void MessagesOutput::Emit(json event) {
  const std::string type = event["type"];
  absl::StrAppend(&out_, "event: ", type, "\ndata: ", event.dump(), "\n\n");
}

json MessagesOutput::BlockJson(const Block& b, bool start) const {
  switch (b.kind) {
    case Kind::kThinking:
      return {{"type", "thinking"}, {"thinking", start ? "" : b.text}, {"signature", ""}};
    case Kind::kText:
      return {{"type", "text"}, {"text", start ? "" : b.text}};
    case Kind::kToolUse: {
      json input = start ? json::object() : json::parse(b.text, nullptr, false);
      if (input.is_discarded()) input = json::object();
      return {{"type", "tool_use"}, {"id", b.id}, {"name", b.name}, {"input", std::move(input)}};
    }
  }
  return nullptr;
}

void MessagesOutput::Open(Kind kind) {
  if (open_ >= 0 && blocks_[open_].kind == kind) return;
  CloseOpen();
  blocks_.push_back({kind, "", "", ""});
  open_ = static_cast<int>(blocks_.size() - 1);
  Emit({{"type", "content_block_start"},
        {"index", open_},
        {"content_block", BlockJson(blocks_[open_], true)}});
}

void MessagesOutput::CloseOpen() {
  if (open_ < 0) return;
  Emit({{"type", "content_block_stop"}, {"index", open_}});
  open_ = -1;
}

std::string MessagesOutput::Opening(const ApiUsage& usage) {
  Emit({{"type", "message_start"},
        {"message",
         {{"id", id_},
          {"type", "message"},
          {"role", "assistant"},
          {"model", model_},
          {"content", json::array()},
          {"stop_reason", nullptr},
          {"stop_sequence", nullptr},
          {"usage", UsageJson(usage)}}}});
  return std::exchange(out_, {});
}

std::string MessagesOutput::Delta(const std::string& reasoning, const std::string& text,
                                  const json& /*logprobs*/,
                                  const std::vector<ParsedToolCall>& calls) {
  if (!reasoning.empty()) {
    Open(Kind::kThinking);
    blocks_[open_].text += reasoning;
    Emit({{"type", "content_block_delta"},
          {"index", open_},
          {"delta", {{"type", "thinking_delta"}, {"thinking", reasoning}}}});
  }
  if (!text.empty()) {
    Open(Kind::kText);
    blocks_[open_].text += text;
    Emit({{"type", "content_block_delta"},
          {"index", open_},
          {"delta", {{"type", "text_delta"}, {"text", text}}}});
  }
  for (const ParsedToolCall& call : calls) {
    CloseOpen();
    blocks_.push_back({Kind::kToolUse, call.arguments, call.id, call.name});
    open_ = static_cast<int>(blocks_.size() - 1);
    Emit({{"type", "content_block_start"},
          {"index", open_},
          {"content_block", BlockJson(blocks_[open_], true)}});
    Emit({{"type", "content_block_delta"},
          {"index", open_},
          {"delta", {{"type", "input_json_delta"}, {"partial_json", call.arguments}}}});
    CloseOpen();
  }
  return std::exchange(out_, {});
}

json MessagesOutput::StopReason(const ApiFinish& finish) {
  if (finish.reason == "length") return "max_tokens";
  if (finish.reason == "tool_calls") return "tool_use";
  if (!finish.stop_string.empty()) return "stop_sequence";
  return "end_turn";
}

json MessagesOutput::UsageJson(const ApiUsage& usage) {
  // Anthropic counts the prompt's tokens read from the cache apart from input_tokens.
  return {{"input_tokens", usage.input - usage.cached},
          {"cache_read_input_tokens", usage.cached},
          {"cache_creation_input_tokens", 0},
          {"output_tokens", usage.output}};
}

json MessagesOutput::Response(const ApiFinish& finish, const ApiUsage& usage) {
  CloseOpen();
  json content = json::array();
  for (const Block& b : blocks_) content.push_back(BlockJson(b, false));
  return {{"id", id_},
          {"type", "message"},
          {"role", "assistant"},
          {"model", model_},
          {"content", std::move(content)},
          {"stop_reason", StopReason(finish)},
          {"stop_sequence", finish.stop_string.empty() ? json(nullptr) : json(finish.stop_string)},
          {"usage", UsageJson(usage)}};
}

std::string MessagesOutput::Closing(const ApiFinish& finish, const ApiUsage& usage) {
  CloseOpen();
  Emit(
      {{"type", "message_delta"},
       {"delta",
        {{"stop_reason", StopReason(finish)},
         {"stop_sequence", finish.stop_string.empty() ? json(nullptr) : json(finish.stop_string)}}},
       {"usage", UsageJson(usage)}});
  Emit({{"type", "message_stop"}});
  return std::exchange(out_, {});
}

std::string MessagesOutput::Failed(const OpenAiError& error) {
  CloseOpen();
  Emit({{"type", "error"}, {"error", ErrorObject(error)}});
  return std::exchange(out_, {});
}

}  // namespace kvserve::frontend
