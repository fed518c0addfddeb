// The Responses API's request translation (frontend/request/responses_request.h) and its event
// stream (frontend/output/responses_output.h): items into chat messages, errors renamed to what the
// client sent, and the events' order, indexes and item ids as OpenAI's clients check them.
#include <string>
#include <vector>

#include "frontend/output/responses_output.h"
#include "frontend/request/responses_request.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/status_matchers.h"

namespace kvserve::frontend {
namespace {

using json = nlohmann::json;
using ::testing::HasSubstr;

json Chat(const std::string& body) {
  absl::StatusOr<ResponsesRequest> r = TranslateResponsesRequest(body, {});
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? json::parse(r->chat_body) : json();
}

std::string Error(const std::string& body) {
  absl::StatusOr<ResponsesRequest> r = TranslateResponsesRequest(body, {});
  if (!r.ok()) return std::string(r.status().message());
  absl::StatusOr<ParsedRequest> p = ParseResponsesAsChat(*r, {});
  return p.ok() ? "" : std::string(p.status().message());
}

TEST(ResponsesRequestTest, ItemsBecomeChatMessages) {
  const json chat = Chat(R"({"model": "m", "instructions": "Be brief.", "max_output_tokens": 9,
    "input": [
      {"role": "developer", "content": "Use tools."},
      {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather "},
                                                      {"type": "input_text", "text": "in Paris?"}]},
      {"type": "reasoning", "id": "rs_1", "summary": [],
       "content": [{"type": "reasoning_text", "text": "Call it."}]},
      {"type": "function_call", "call_id": "call_a", "name": "get_weather", "arguments": "{}"},
      {"type": "function_call", "call_id": "call_b", "name": "now", "arguments": "{}"},
      {"type": "function_call_output", "call_id": "call_a", "output": "21C"},
      {"type": "function_call_output", "call_id": "call_b",
       "output": [{"type": "input_text", "text": "noon"}]}],
    "tools": [{"type": "function", "name": "now", "parameters": {}}],
    "tool_choice": {"type": "function", "name": "now"},
    "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}}})");
  const json want = json::parse(R"([
    {"role": "system", "content": "Be brief."},
    {"role": "system", "content": "Use tools."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "reasoning_content": "Call it.", "tool_calls": [
      {"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}},
      {"id": "call_b", "type": "function", "function": {"name": "now", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "call_a", "content": "21C"},
    {"role": "tool", "tool_call_id": "call_b", "content": "noon"}])");
  EXPECT_EQ(chat["messages"], want);
  EXPECT_EQ(chat["max_tokens"], 9);
  EXPECT_EQ(chat["tools"][0], json::parse(R"({"type": "function", "function":
                                               {"name": "now", "parameters": {}}})"));
  EXPECT_EQ(chat["tool_choice"],
            json::parse(R"({"type": "function", "function": {"name": "now"}})"));
  EXPECT_EQ(chat["response_format"]["json_schema"]["name"], "x");
}

TEST(ResponsesRequestTest, ReasoningWithNoTurnAfterItIsOne) {
  const json chat = Chat(R"({"model": "m", "input": [
      {"role": "user", "content": "a"},
      {"type": "reasoning", "summary": [{"type": "summary_text", "text": "hm"}]},
      {"role": "user", "content": "b"}]})");
  EXPECT_EQ(chat["messages"][1],
            json::parse(R"({"role": "assistant", "content": "", "reasoning_content": "hm"})"));
  EXPECT_EQ(chat["messages"][2]["content"], "b");
}

TEST(ResponsesRequestTest, ErrorsNameWhatTheClientSent) {
  EXPECT_THAT(Error(R"({"model": "m"})"), HasSubstr("input: is required"));
  EXPECT_THAT(Error(R"({"model": "m", "input": "x", "max_output_tokens": -1})"),
              HasSubstr("max_output_tokens:"));
  EXPECT_THAT(Error(R"({"model": "m", "input": [{"role": "user", "content": "a"},
                        {"type": "function_call", "call_id": "c", "name": "f",
                         "arguments": "{not json"}]})"),
              HasSubstr("input[1].tool_calls[0].function.arguments"));
  EXPECT_THAT(Error(R"({"model": "m", "input": "x", "tools": [{"type": "function",
                        "name": "f", "parameters": {"type": "string"}}]})"),
              HasSubstr("tools[0].parameters.type"));
  EXPECT_THAT(Error(R"({"model": "m", "input": "x", "text": {"format": {"type": "json_schema",
                        "name": "s", "schema": {"type": "object", "minProperties": "x"}}}})"),
              HasSubstr("text.format"));
  EXPECT_THAT(Error(R"({"model": "m", "input": "x", "store": true})"), HasSubstr("store:"));
  EXPECT_THAT(Error(R"({"model": "m", "input": "x", "stream_options": {"include_obfuscation":
                        true}})"),
              HasSubstr("stream_options.include_obfuscation"));
  EXPECT_THAT(Error(R"({"model": "m", "input": [{"type": "computer_call"}]})"),
              HasSubstr("input[0].type: 'computer_call' is not served"));
  EXPECT_THAT(Error(R"({"model": "m", "input": [{"type": "reasoning",
                        "encrypted_content": "zz"}]})"),
              HasSubstr("input[0].encrypted_content"));
  EXPECT_THAT(
      Error("{\"model\": \"m\", \"input\": " + std::string(200, '[') + std::string(200, ']') + "}"),
      HasSubstr("deeper than 128"));
  // Brackets in strings (an escaped quote does not end one) are text, not nesting.
  const std::string brackets = "\"\\\"" + std::string(200, '[') + "\"";
  EXPECT_THAT(Error("{\"model\": \"m\", \"input\": " + brackets + ", \"store\": true}"),
              HasSubstr("store:"));
  EXPECT_THAT(Error("not json"), HasSubstr("body: is not valid JSON"));
}

// With a store: store defaults to true; a chained request's messages are its instructions, the
// stored conversation, then its input; its input items get ids; a response the store does not
// hold is a NotFound naming previous_response_id.
TEST(ResponsesRequestTest, AChainedRequestContinuesTheStoredConversation) {
  const json stored = json::parse(R"([
    {"type": "message", "id": "msg_a", "role": "user",
     "content": [{"type": "input_text", "text": "My name is Ada."}]},
    {"type": "message", "id": "msg_b", "status": "completed", "role": "assistant",
     "content": [{"type": "output_text", "text": "Hello Ada.", "annotations": [], "logprobs": []}]}
  ])");
  std::vector<std::string> asked;
  const ResponsesState state{.store = true,
                             .conversation = [&](const std::string& id) -> absl::StatusOr<json> {
                               asked.push_back(id);
                               if (id != "resp_1") return absl::NotFoundError("none");
                               return stored;
                             }};
  ASSERT_OK_AND_ASSIGN(ResponsesRequest r,
                       TranslateResponsesRequest(R"({"model": "m", "instructions": "Be brief.",
                         "previous_response_id": "resp_1", "input": "What is my name?"})",
                                                 {}, state));
  EXPECT_EQ(asked, std::vector<std::string>{"resp_1"});
  const json messages = json::parse(r.chat_body)["messages"];
  ASSERT_EQ(messages.size(), 4u);
  EXPECT_EQ(messages[0], json({{"role", "system"}, {"content", "Be brief."}}));
  EXPECT_EQ(messages[1], json({{"role", "user"}, {"content", "My name is Ada."}}));
  EXPECT_EQ(messages[2], json({{"role", "assistant"}, {"content", "Hello Ada."}}));
  EXPECT_EQ(messages[3], json({{"role", "user"}, {"content", "What is my name?"}}));
  EXPECT_TRUE(r.store);
  EXPECT_EQ(r.echo["store"], true);
  EXPECT_EQ(r.echo["previous_response_id"], "resp_1");
  EXPECT_EQ(r.previous_items, stored);
  ASSERT_EQ(r.input_items.size(), 1u);
  EXPECT_THAT(r.input_items[0]["id"].get<std::string>(), ::testing::StartsWith("msg_"));
  EXPECT_EQ(r.input_items[0]["content"][0]["text"], "What is my name?");

  ASSERT_OK_AND_ASSIGN(r, TranslateResponsesRequest(R"({"model": "m", "store": false,
                         "input": [{"type": "function_call_output", "call_id": "c", "output": "1"},
                                   {"role": "user", "content": "x", "id": "mine"}]})",
                                                    {}, state));
  EXPECT_FALSE(r.store);
  EXPECT_EQ(r.echo["previous_response_id"], nullptr);
  EXPECT_THAT(r.input_items[0]["id"].get<std::string>(), ::testing::StartsWith("fco_"));
  EXPECT_EQ(r.input_items[1]["id"], "mine");  // a client's own id is kept
  EXPECT_THAT(TranslateResponsesRequest(
                  R"({"model": "m", "previous_response_id": "resp_2", "input": "x"})", {}, state)
                  .status(),
              testing::StatusIs(absl::StatusCode::kNotFound,
                                HasSubstr("previous_response_id: no stored response 'resp_2'")));
  EXPECT_THAT(Error(R"({"model": "m", "previous_response_id": "resp_1", "input": "x"})"),
              HasSubstr("previous_response_id: needs a Responses store"));
  EXPECT_THAT(
      TranslateResponsesRequest(R"({"model": "m", "store": "yes", "input": "x"})", {}, state)
          .status()
          .message(),
      HasSubstr("store: must be true or false"));
}

// The events, parsed, of one stream: reasoning, then text, then a call.
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

TEST(ResponsesOutputTest, StreamedItemsOpenAndCloseInOrder) {
  ResponsesOutput out(json{{"tools", json::array()}}, /*logprobs=*/false);
  out.Begin("abc", 1, "m");
  std::string sse = out.Opening({});
  sse += out.Delta("Let me ", "", json::array(), {});
  sse += out.Delta("think.", "", json::array(), {});
  sse += out.Delta("", "Calling.", json::array(), {});
  sse += out.Delta("", "", json::array(), {{"call_x", "now", "{}"}});
  sse += out.Closing({"tool_calls", ""}, {.input = 5, .cached = 0, .output = 9, .reasoning = 3});
  std::vector<std::string> types;
  const std::vector<json> events = Events(sse);
  for (size_t i = 0; i < events.size(); ++i) {
    types.push_back(events[i]["type"]);
    EXPECT_EQ(events[i]["sequence_number"], i);
  }
  EXPECT_EQ(types, (std::vector<std::string>{"response.created",
                                             "response.in_progress",
                                             "response.output_item.added",
                                             "response.content_part.added",
                                             "response.reasoning_text.delta",
                                             "response.reasoning_text.delta",
                                             "response.reasoning_text.done",
                                             "response.content_part.done",
                                             "response.output_item.done",
                                             "response.output_item.added",
                                             "response.content_part.added",
                                             "response.output_text.delta",
                                             "response.output_text.done",
                                             "response.content_part.done",
                                             "response.output_item.done",
                                             "response.output_item.added",
                                             "response.function_call_arguments.delta",
                                             "response.function_call_arguments.done",
                                             "response.output_item.done",
                                             "response.completed"}));
  const json& done = events.back()["response"];
  ASSERT_EQ(done["output"].size(), 3u);
  EXPECT_EQ(done["output"][0]["content"][0]["text"], "Let me think.");
  EXPECT_EQ(done["output"][1]["content"][0]["text"], "Calling.");
  EXPECT_EQ(done["output"][2]["call_id"], "call_x");
  // Every event about an item names that item's id at its output index.
  for (const json& e : events) {
    if (!e.contains("item_id")) continue;
    EXPECT_EQ(e["item_id"], done["output"][e["output_index"].get<int>()]["id"]) << e.dump();
  }
  EXPECT_EQ(done["usage"]["output_tokens_details"]["reasoning_tokens"], 3);
  EXPECT_EQ(done["usage"]["total_tokens"], 14);
}

TEST(ResponsesOutputTest, AnEmptyOrCutAnswerStillHasAMessage) {
  ResponsesOutput out(json::object(), false);
  out.Begin("abc", 1, "m");
  out.Delta("only thinking", "", json::array(), {});
  const json r = out.Response({"length", ""}, {});
  EXPECT_EQ(r["status"], "incomplete");
  EXPECT_EQ(r["incomplete_details"]["reason"], "max_output_tokens");
  ASSERT_EQ(r["output"].size(), 2u);
  EXPECT_EQ(r["output"][1]["type"], "message");
  EXPECT_EQ(r["output"][1]["content"][0]["text"], "");
  EXPECT_EQ(r["output"][1]["status"], "incomplete");  // the message the budget cut
  EXPECT_EQ(r["output"][0]["status"], "completed");
}

TEST(ResponsesOutputTest, FailedCarriesTheError) {
  ResponsesOutput out(json::object(), false);
  out.Begin("abc", 1, "m");
  out.Opening({});
  const std::vector<json> events =
      Events(out.Failed({500, R"({"error": {"message": "worker lost", "code": null}})"}));
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0]["type"], "response.failed");
  EXPECT_EQ(events[0]["response"]["error"]["message"], "worker lost");
  EXPECT_EQ(events[0]["response"]["error"]["code"], "server_error");
}

}  // namespace
}  // namespace kvserve::frontend
