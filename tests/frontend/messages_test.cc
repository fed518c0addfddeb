// Anthropic's Messages API: the request translation (frontend/request/messages_request.h) and the
// answer (frontend/output/messages_output.h): blocks into chat messages, errors renamed to what the
// client sent, the events' order and indexes, stop reasons, usage and the error shape.
#include <string>
#include <vector>

#include "frontend/output/messages_output.h"
#include "frontend/request/messages_request.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace kvserve::frontend {
namespace {

using json = nlohmann::json;
using ::testing::HasSubstr;

json Chat(const std::string& body) {
  absl::StatusOr<MessagesRequest> r = TranslateMessagesRequest(body, {});
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? json::parse(r->chat_body) : json();
}

std::string Error(const std::string& body) {
  absl::StatusOr<MessagesRequest> r = TranslateMessagesRequest(body, {});
  if (!r.ok()) return std::string(r.status().message());
  absl::StatusOr<ParsedRequest> p = ParseMessagesAsChat(*r, {});
  return p.ok() ? "" : std::string(p.status().message());
}

TEST(MessagesRequestTest, BlocksBecomeChatMessages) {
  const json chat = Chat(R"({"model": "m", "max_tokens": 9, "system": "Be brief.",
    "stop_sequences": ["END"], "metadata": {"user_id": "u1"},
    "messages": [
      {"role": "user", "content": "Weather?"},
      {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "Call it.", "signature": "x"},
        {"type": "text", "text": "Checking."},
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
      {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "21C"}]},
        {"type": "text", "text": "And tomorrow?"}]}],
    "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}],
    "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
    "thinking": {"type": "disabled"}})");
  const json want = json::parse(R"([
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather?"},
    {"role": "assistant", "content": "Checking.", "reasoning_content": "Call it.", "tool_calls": [
      {"id": "toolu_1", "type": "function",
       "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "toolu_1", "content": "21C"},
    {"role": "user", "content": "And tomorrow?"}])");
  EXPECT_EQ(chat["messages"], want);
  EXPECT_EQ(chat["stop"], json::array({"END"}));
  EXPECT_EQ(chat["user"], "u1");
  EXPECT_EQ(chat["tool_choice"], "required");
  EXPECT_EQ(chat["parallel_tool_calls"], false);
  EXPECT_EQ(chat["tools"][0]["function"]["parameters"], json::parse(R"({"type": "object"})"));
  EXPECT_EQ(chat["chat_template_kwargs"]["enable_thinking"], false);
}

TEST(MessagesRequestTest, ErrorsNameWhatTheClientSent) {
  EXPECT_THAT(Error(R"({"model": "m", "messages": [{"role": "user", "content": "x"}]})"),
              HasSubstr("max_tokens: is required"));
  // After a system message, chat's messages[2] is the client's messages[1].
  absl::StatusOr<MessagesRequest> r = TranslateMessagesRequest(
      R"({"model": "m", "max_tokens": 4, "system": "s", "messages": [
          {"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]})",
      {});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(RenameMessagesParam("messages[2].content: bad", *r), "messages[1].content: bad");
  EXPECT_EQ(RenameMessagesParam("stop[0]: bad", *r), "stop_sequences[0]: bad");
  EXPECT_THAT(Error(R"({"model": "m", "max_tokens": 4, "stop_sequences": [1],
                        "messages": [{"role": "user", "content": "x"}]})"),
              HasSubstr("stop_sequences"));
  EXPECT_THAT(Error(R"({"model": "m", "max_tokens": 4, "tools": [{"name": "f",
                        "input_schema": {"type": "array"}}],
                        "messages": [{"role": "user", "content": "x"}]})"),
              HasSubstr("tools[0].input_schema.type"));
  EXPECT_THAT(Error(R"({"model": "m", "max_tokens": 4, "messages": [{"role": "user",
                        "content": [{"type": "document", "source": {}}]}]})"),
              HasSubstr("messages[0].content[0].type"));
  EXPECT_THAT(Error(R"({"model": "m", "max_tokens": 4, "messages": [{"role": "assistant",
                        "content": [{"type": "tool_use", "id": "t", "name": "f",
                        "input": [1]}]}]})"),
              HasSubstr("messages[0].content[0].input: must be an object"));
  EXPECT_THAT(Error(R"({"model": "m", "max_tokens": 4, "thinking": {"type": "enabled",
                        "budget_tokens": 2000}, "messages": [{"role": "user", "content": "x"}]})"),
              HasSubstr("thinking.budget_tokens"));
  EXPECT_THAT(Error(R"({"model": "m", "max_tokens": 4, "container": "c",
                        "messages": [{"role": "user", "content": "x"}]})"),
              HasSubstr("container:"));
}

std::vector<json> Events(const std::string& sse) {
  std::vector<json> out;
  size_t at = 0;
  while ((at = sse.find("data: ", at)) != std::string::npos) {
    const size_t end = sse.find("\n\n", at);
    out.push_back(json::parse(sse.substr(at + 6, end - at - 6)));
    at = end;
  }
  return out;
}

TEST(MessagesOutputTest, StreamedBlocksAndTheWholeMessageAgree) {
  MessagesOutput out;
  out.Begin("abc", 1, "m");
  std::string sse = out.Opening({.input = 10, .cached = 4});
  sse += out.Delta("Hm.", "", json::array(), {});
  sse += out.Delta("", "Checking.", json::array(), {});
  sse += out.Delta("", "", json::array(), {{"call_1", "get_weather", R"({"city": "Paris"})"}});
  sse += out.Closing({"tool_calls", ""}, {.input = 10, .cached = 4, .output = 7});
  std::vector<std::string> types;
  const std::vector<json> events = Events(sse);
  for (const json& e : events) types.push_back(e["type"]);
  EXPECT_EQ(types, (std::vector<std::string>{
                       "message_start", "content_block_start", "content_block_delta",
                       "content_block_stop", "content_block_start", "content_block_delta",
                       "content_block_stop", "content_block_start", "content_block_delta",
                       "content_block_stop", "message_delta", "message_stop"}));
  EXPECT_EQ(events[0]["message"]["id"], "msg_abc");
  EXPECT_EQ(events[0]["message"]["usage"]["input_tokens"], 6);
  EXPECT_EQ(events[0]["message"]["usage"]["cache_read_input_tokens"], 4);
  EXPECT_EQ(events[8]["delta"]["partial_json"], R"({"city": "Paris"})");
  EXPECT_EQ(events[10]["delta"]["stop_reason"], "tool_use");
  EXPECT_EQ(events[10]["usage"]["output_tokens"], 7);
  const json m = out.Response({"tool_calls", ""}, {});
  ASSERT_EQ(m["content"].size(), 3u);
  EXPECT_EQ(m["content"][0], json::parse(R"({"type": "thinking", "thinking": "Hm.",
                                            "signature": ""})"));
  EXPECT_EQ(m["content"][2]["input"], json::parse(R"({"city": "Paris"})"));
  EXPECT_EQ(m["content"][2]["id"], "call_1");
}

TEST(MessagesOutputTest, StopReasons) {
  MessagesOutput out;
  out.Begin("abc", 1, "m");
  out.Delta("", "Hi", json::array(), {});
  EXPECT_EQ(out.Response({"stop", ""}, {})["stop_reason"], "end_turn");
  EXPECT_EQ(out.Response({"length", ""}, {})["stop_reason"], "max_tokens");
  const json stopped = out.Response({"stop", "END"}, {});
  EXPECT_EQ(stopped["stop_reason"], "stop_sequence");
  EXPECT_EQ(stopped["stop_sequence"], "END");
}

TEST(MessagesOutputTest, ErrorsInAnthropicsShape) {
  const OpenAiError e =
      AnthropicError({400, R"({"error": {"message": "messages: bad", "type": "x"}})"});
  EXPECT_EQ(e.http_status, 400);
  EXPECT_EQ(json::parse(e.json), json::parse(R"({"type": "error", "error": {
      "type": "invalid_request_error", "message": "messages: bad"}})"));
  MessagesOutput out;
  out.Begin("abc", 1, "m");
  const std::vector<json> events = Events(out.Failed({503, R"({"error": {"message": "gone"}})"}));
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0]["error"]["type"], "overloaded_error");
}

}  // namespace
}  // namespace kvserve::frontend
