#include "frontend/request/openai_request.h"

#include <functional>
#include <map>
#include <string>

#include "frontend/output/openai_error.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/reflection.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/frontend/request_test_util.h"
#include "tests/testing/status_matchers.h"

namespace kvserve::frontend {
namespace {

using kvserve::testing::StatusIs;
using ::testing::HasSubstr;
using json = nlohmann::json;
using testing::ExpectParam;

// The router's half of "a request has one definition": every field of the wire's
// SamplingParams (walked from its descriptor, so a field added there is covered without an edit
// here) is filled by the parser from the body key of the same name, unless it is listed below
// as reaching the wire another way. A new field the parser does not read fails here by name.
TEST(OpenAiRequestTest, EverySamplingFieldOfTheWireComesFromTheBody) {
  namespace gp = google::protobuf;
  // Fields whose body key or value differs from the wire's, with how the parse shows them.
  const std::map<std::string, std::pair<json, std::function<bool(const ParsedRequest&)>>> other = {
      // Strings in the body; token ids once tokenized (ResolveTokenParameters).
      {"bad_words",
       {{{"bad_words", {"foo"}}}, [](const ParsedRequest& r) { return !r.bad_words.empty(); }}},
      // The router's own field; the wire's is worker_prompt_logprobs(), set on the job.
      {"prompt_logprobs",
       {{{"prompt_logprobs", 2}},
        [](const ParsedRequest& r) { return r.worker_prompt_logprobs() == 2; }}},
      // structured_outputs / guided_* / response_format; ConstraintToWire on the job.
      {"constraint",
       {{{"guided_regex", "a+"}}, [](const ParsedRequest& r) { return r.constraint.has_value(); }}},
  };
  const gp::Descriptor* d = kvserve::v1::SamplingParams::descriptor();
  ASSERT_GT(d->field_count(), 15);
  for (int i = 0; i < d->field_count(); ++i) {
    const gp::FieldDescriptor* f = d->field(i);
    json body = {{"model", "m"}, {"prompt", "x"}, {"max_tokens", 8}};
    if (auto it = other.find(f->name()); it != other.end()) {
      body.update(it->second.first);
      ASSERT_OK_AND_ASSIGN(ParsedRequest r, ParseCompletionRequest(body.dump(), false));
      EXPECT_TRUE(it->second.second(r)) << f->name();
      continue;
    }
    using F = gp::FieldDescriptor;
    json value;
    if (f->is_map()) {
      value = {{"5", 1.5}};
    } else if (f->is_repeated()) {
      value = {5};
    } else if (f->cpp_type() == F::CPPTYPE_BOOL) {
      value = true;
    } else if (f->cpp_type() == F::CPPTYPE_FLOAT || f->cpp_type() == F::CPPTYPE_DOUBLE) {
      value = 0.5;  // inside every float parameter's range
    } else {
      value = 2;
    }
    body[f->name()] = value;
    absl::StatusOr<ParsedRequest> r = ParseCompletionRequest(body.dump(), false);
    if (!r.ok()) {  // refused: by name
      EXPECT_NE(r.status().message().find(f->name()), std::string::npos) << r.status();
      continue;
    }
    // What the body said, compared with a parse without the key.
    body.erase(f->name());
    ASSERT_OK_AND_ASSIGN(ParsedRequest without, ParseCompletionRequest(body.dump(), false));
    EXPECT_NE(r->sampling.SerializeAsString(), without.sampling.SerializeAsString())
        << "SamplingParams." << f->name() << ": the body's '" << f->name()
        << "' did not reach the wire message, and the parse did not refuse it";
  }
}

TEST(OpenAiRequestTest, ParsesCompletions) {
  json body = {{"model", "m"},
               {"prompt", "Hello"},
               {"max_tokens", 7},
               {"temperature", 0.5},
               {"top_p", 0.9},
               {"top_k", 40},
               {"min_p", 0.05},
               {"seed", 42},
               {"n", 2},
               {"stop", {"\n", "###"}},
               {"logprobs", 3},
               {"stream", true},
               {"stream_options", {{"include_usage", true}}},
               {"ignore_eos", true},
               {"user", "u1"},
               {"cache_salt", "t"},
               {"truncate_prompt_tokens", 100},
               {"some_future_field", {1, 2}}};
  ASSERT_OK_AND_ASSIGN(ParsedRequest r, ParseCompletionRequest(body.dump(), false));
  EXPECT_EQ(r.model, "m");
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(*r.prompts[0].text, "Hello");
  EXPECT_EQ(r.max_tokens, 7);
  EXPECT_FLOAT_EQ(r.sampling.temperature(), 0.5f);
  EXPECT_EQ(r.sampling.top_k(), 40);
  EXPECT_EQ(r.sampling.seed(), 42u);
  EXPECT_EQ(r.n(), 2);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"\n", "###"}));
  EXPECT_EQ(*r.logprobs(), 3);
  EXPECT_TRUE(r.stream && r.include_usage && r.sampling.ignore_eos());
  EXPECT_EQ(r.cache_salt, "t");
  EXPECT_EQ(*r.truncate_prompt_tokens, 100);
  ASSERT_OK_AND_ASSIGN(r, ParseCompletionRequest(R"({"model": "m", "prompt": [1, 2, 3]})", false));
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(r.prompts[0].ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(r.max_tokens, 16);
  EXPECT_FALSE(r.max_tokens_given);
}

TEST(OpenAiRequestTest, ParsesChat) {
  json body = {{"model", "m"},
               {"messages",
                {{{"role", "system"}, {"content", "Be brief."}},
                 {{"role", "user"},
                  {"content",
                   {{{"type", "text"}, {"text", "Hi "}}, {{"type", "text"}, {"text", "there"}}}}}}},
               {"max_completion_tokens", 9},
               {"logprobs", true},
               {"top_logprobs", 2},
               {"chat_template_kwargs", {{"enable_thinking", false}}}};
  ASSERT_OK_AND_ASSIGN(ParsedRequest r, ParseCompletionRequest(body.dump(), true));
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[1].content, "Hi there");
  EXPECT_EQ(r.max_tokens, 9);
  EXPECT_EQ(*r.logprobs(), 2);
  EXPECT_EQ(r.enable_thinking, false);
}

TEST(OpenAiRequestTest, BadRequestsNameTheParameter) {
  struct Case {
    std::string body;
    bool chat;
    const char* param;
  };
  std::vector<Case> cases = {
      {"{not json", false, "body"},
      {"[1, 2]", false, "body"},
      {std::string("{\"model\": \"m\", \"prompt\": \"\xff\"}"), false, "body"},
      {R"({"prompt": "x"})", false, "model"},
      {R"({"model": "m"})", false, "prompt"},
      {R"({"model": "m", "prompt": "x", "max_tokens": -1})", false, "max_tokens"},
      {R"({"model": "m", "prompt": "x", "max_tokens": 1e12})", false, "max_tokens"},
      {R"({"model": "m", "prompt": "x", "n": 0})", false, "n"},
      {R"({"model": "m", "prompt": "x", "temperature": 3})", false, "temperature"},
      {R"({"model": "m", "prompt": "x", "top_p": 0})", false, "top_p"},
      {R"({"model": "m", "prompt": "x", "stop": 5})", false, "stop"},
      {R"({"model": "m", "prompt": "x", "logprobs": -1})", false, "logprobs"},
      {R"({"model": "m", "prompt": [1, -2]})", false, "prompt"},
      {R"({"model": "m", "prompt": [["a"]]})", false, "prompt[0]"},
      {R"({"model": "m", "prompt": "x", "stream": "yes"})", false, "stream"},
      {R"({"model": "m", "messages": []})", true, "messages"},
      {R"({"model": "m", "messages": [{"content": "x"}]})", true, "messages[0].role"},
      {R"({"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]})",
       true, "messages[0].content"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<ParsedRequest> r = ParseCompletionRequest(c.body, c.chat);
    EXPECT_THAT(r, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.param))) << c.body;
    if (r.ok()) continue;
    OpenAiError e = OpenAiErrorFromStatus(r.status());
    EXPECT_EQ(e.http_status, 400);
    json j = json::parse(e.json);
    EXPECT_EQ(j["error"]["type"], "invalid_request_error");
    EXPECT_EQ(j["error"]["param"], c.param) << c.body;
  }
}

// The logits adjustments are parsed with their ranges: penalties, min_tokens, logit_bias (ids
// as string keys), bad_words, allowed_token_ids.
TEST(OpenAiRequestTest, ParsesLogitsAdjustments) {
  ASSERT_OK_AND_ASSIGN(ParsedRequest r, ParseCompletionRequest(R"({"model": "m", "prompt": "x",
      "presence_penalty": 0.5, "frequency_penalty": -1, "repetition_penalty": 1.1,
      "min_tokens": 4, "max_tokens": 8, "logit_bias": {"50256": -100, "7": 2.5},
      "bad_words": ["foo", " bar baz"], "allowed_token_ids": [3, 1, 3]})",
                                                               /*chat=*/false));
  EXPECT_EQ(r.sampling.presence_penalty(), 0.5f);
  EXPECT_EQ(r.sampling.frequency_penalty(), -1.0f);
  EXPECT_EQ(r.sampling.repetition_penalty(), 1.1f);
  EXPECT_EQ(r.sampling.min_tokens(), 4);
  using Bias = std::vector<std::pair<int32_t, float>>;
  EXPECT_THAT(Bias(r.sampling.logit_bias().begin(), r.sampling.logit_bias().end()),
              ::testing::UnorderedElementsAre(std::pair{50256, -100.0f}, std::pair{7, 2.5f}));
  EXPECT_THAT(r.bad_words, ::testing::ElementsAre("foo", " bar baz"));
  EXPECT_THAT(r.sampling.allowed_token_ids(), ::testing::ElementsAre(3, 1, 3));

  struct Case {
    json extra;
    bool chat;
    const char* message;
  };
  const std::vector<Case> bad = {
      {{{"presence_penalty", 2.5}}, false, "presence_penalty: must be in [-2, 2], got 2.5"},
      {{{"frequency_penalty", -3}}, true, "frequency_penalty: must be in [-2, 2]"},
      {{{"repetition_penalty", 0}}, false, "repetition_penalty: must be > 0, got 0"},
      {{{"repetition_penalty", "x"}}, false, "repetition_penalty: must be a number"},
      {{{"min_tokens", -1}}, false, "min_tokens: must be in [0, "},
      {{{"min_tokens", 9}, {"max_tokens", 8}}, false, "min_tokens: must be at most max_tokens (8)"},
      {{{"logit_bias", 5}}, false, "logit_bias: must be an object"},
      {{{"logit_bias", {{"abc", 1}}}}, true, "logit_bias: key 'abc' is not a token id"},
      {{{"logit_bias", {{"-4", 1}}}}, true, "logit_bias: key '-4' is not a token id"},
      // Every bad key named at once (vLLM's test_chat_logit_bias_multiple_non_integer_keys).
      {{{"logit_bias", {{"bad1", 50}, {"7", 1}, {"bad2", 20}}}},
       true,
       "logit_bias: keys 'bad1', 'bad2' are not token ids"},
      {{{"logit_bias", {{"4", 101}}}},
       true,
       "logit_bias: the bias of token 4 must be in [-100, 100]"},
      {{{"logit_bias", {{"4", "up"}}}}, true, "logit_bias: the bias of token 4 must be a number"},
      {{{"bad_words", "x"}}, false, "bad_words: must be a list of strings"},
      {{{"bad_words", {1}}}, false, "bad_words: must hold strings"},
      {{{"allowed_token_ids", {-1}}}, false, "allowed_token_ids: token ids must be non-negative"},
      {{{"allowed_token_ids", 3}}, false, "allowed_token_ids: must be a list of token ids"},
  };
  for (const Case& c : bad) {
    json body = testing::MinimalBody(c.chat);
    body.update(c.extra);
    EXPECT_THAT(ParseCompletionRequest(body.dump(), c.chat),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.message)))
        << body;
  }
  RequestLimits limits;
  limits.max_token_list_ids = 2;
  EXPECT_THAT(ParseCompletionRequest(R"({"model": "m", "prompt": "x",
      "allowed_token_ids": [1, 2, 3]})",
                                     false, limits),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("allowed_token_ids: has 3 ids; the limit is 2 "
                                 "(--max-token-list-ids)")));
}

// Tools are checked entry by entry, tool_choice against them; "required" and a named function
// become a JSON-schema constraint; assistant tool calls and tool results are kept for the
// template.
TEST(OpenAiRequestTest, Tools) {
  const json weather = {{"type", "function"},
                        {"function",
                         {{"name", "get_weather"},
                          {"parameters",
                           {{"type", "object"},
                            {"properties", {{"city", {{"type", "string"}}}}},
                            {"required", {"city"}}}}}}};
  struct Case {
    json extra;
    const char* param;  // nullptr: accepted
  };
  const std::vector<Case> cases = {
      {{{"tools", {weather}}}, nullptr},
      {{{"tools", {weather}}, {"tool_choice", "required"}}, nullptr},
      {{{"tools", {weather}},
        {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}}},
       nullptr},
      {{{"tools", "x"}}, "tools"},
      {{{"tools", {{{"type", "retrieval"}}}}}, "tools[0].type"},
      {{{"tools", {{{"type", "function"}, {"function", {{"name", "bad name"}}}}}}},
       "tools[0].function.name"},
      {{{"tools", {weather, weather}}}, "tools[1].function.name"},
      {{{"tools", {{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", 3}}}}}}},
       "tools[0].function.parameters"},
      {{{"tools",
         {{{"type", "function"},
           {"function", {{"name", "f"}, {"parameters", {{"type", "object"}, {"if", true}}}}}}}},
        {"tool_choice", "required"}},
       "tools[0].function.parameters"},
      // A function's arguments are a JSON object: another type is refused, none or {} pass.
      {{{"tools",
         {{{"type", "function"},
           {"function", {{"name", "f"}, {"parameters", {{"type", "string"}}}}}}}}},
       "tools[0].function.parameters.type"},
      {{{"tools",
         {{{"type", "function"},
           {"function", {{"name", "f"}, {"parameters", {{"type", {"object", "null"}}}}}}}}}},
       "tools[0].function.parameters.type"},
      {{{"tools",
         {{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", json::object()}}}}}},
        {"tool_choice", "required"}},
       nullptr},
      {{{"tools", {weather}}, {"tool_choice", "sometimes"}}, "tool_choice"},
      {{{"tools", {weather}},
        {"tool_choice", {{"type", "function"}, {"function", {{"name", "nope"}}}}}},
       "tool_choice"},
      {{{"tool_choice", "required"}}, "tool_choice"},
      {{{"tools", {weather}},
        {"tool_choice", "required"},
        {"response_format", {{"type", "json_object"}}}},
       "tool_choice"},
      {{{"tools", {weather}}, {"parallel_tool_calls", "yes"}}, "parallel_tool_calls"},
      {{{"messages",
         {{{"role", "assistant"},
           {"tool_calls",
            {{{"id", "c"}, {"function", {{"name", "f"}, {"arguments", "{oops"}}}}}}}}}},
       "messages[0].tool_calls[0].function.arguments"},
  };
  for (const Case& c : cases) ExpectParam(c.extra, /*chat=*/true, c.param);
  json body = {
      {"model", "m"},
      {"messages",
       {{{"role", "user"}, {"content", "Weather?"}},
        {{"role", "assistant"},
         {"content", nullptr},
         {"tool_calls",
          {{{"id", "call_1"},
            {"type", "function"},
            {"function", {{"name", "get_weather"}, {"arguments", "{\"city\":\"Oslo\"}"}}}}}}},
        {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "cold"}}}},
      {"tools", {weather}},
      {"tool_choice", "required"},
      {"parallel_tool_calls", false}};
  ASSERT_OK_AND_ASSIGN(ParsedRequest r, ParseCompletionRequest(body.dump(), true));
  EXPECT_EQ(r.tool_use.choice, ToolChoice::kRequired);
  EXPECT_FALSE(r.tool_use.parallel);
  ASSERT_EQ(r.tool_use.tools.size(), 1u);
  EXPECT_EQ(json::parse(r.tool_use.tools[0].definition), weather);
  ASSERT_TRUE(r.constraint.has_value());
  EXPECT_EQ(r.constraint->kind, structured::ConstraintSpec::Kind::kJsonSchema);
  EXPECT_EQ(json::parse(r.constraint->json_schema)["maxItems"], 1);
  ASSERT_EQ(r.messages[1].tool_calls.size(), 1u);
  EXPECT_EQ(r.messages[1].tool_calls[0].name, "get_weather");
  EXPECT_EQ(r.messages[1].tool_calls[0].arguments, "{\"city\":\"Oslo\"}");
  EXPECT_EQ(r.messages[2].tool_call_id, "call_1");
}

// Each cap refuses with the parameter and the limit named; at the cap it passes.
TEST(OpenAiRequestTest, LimitsNameTheParameterAndTheLimit) {
  RequestLimits l;
  l.max_stop_strings = 2;
  l.max_stop_string_bytes = 4;
  l.max_stop_token_ids = 2;
  l.max_messages = 2;
  l.max_prompt_bytes = 10;
  l.max_prompt_ids = 3;
  auto parse = [&](json body, bool chat = false) {
    body["model"] = "m";
    if (!chat && !body.contains("prompt")) body["prompt"] = "hi";
    return ParseCompletionRequest(body.dump(), chat, l);
  };
  EXPECT_OK(parse({{"stop", {"a", "bcde"}}, {"stop_token_ids", {1, 2}}}).status());
  EXPECT_THAT(parse({{"stop", {"a", "b", "c"}}}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("stop: has 3 strings; the limit is 2 (--max-stop-strings)")));
  EXPECT_THAT(parse({{"stop", "abcde"}}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("stop: a stop string has 5 bytes; the limit is 4")));
  EXPECT_THAT(parse({{"stop_token_ids", {1, 2, 3}}}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("stop_token_ids: has 3 ids; the limit is 2")));
  EXPECT_THAT(parse({{"prompt", "01234567890"}}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("prompt: has over 11 bytes of text; the limit is 10")));
  EXPECT_THAT(parse({{"prompt", {1, 2, 3, 4}}}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("prompt: has 4 token ids; the model's context holds 3")));
  const json msg = {{"role", "user"}, {"content", "123456"}};
  EXPECT_THAT(parse({{"messages", {msg, msg, msg}}}, true).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("messages: has 3 messages; the limit is 2 (--max-messages)")));
  EXPECT_THAT(parse({{"messages", {msg, msg}}}, true).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("messages: has over 12 bytes of text; the limit is 10")));
}

TEST(OpenAiRequestTest, LogprobBudget) {
  constexpr int64_t kVocab = 1000;
  RequestLimits l;
  l.max_logprobs = -1;
  l.max_logprob_entries = 1000;
  ParsedRequest r;
  EXPECT_OK(CheckLogprobBudget(r, 1'000'000, l, 0, kVocab));  // no logprobs asked: nothing kept
  r.sampling.set_n(2);
  r.sampling.set_logprobs(4);
  EXPECT_OK(CheckLogprobBudget(r, 100, l, 0, kVocab));  // 2 × 100 × 5 = 1000
  EXPECT_THAT(CheckLogprobBudget(r, 101, l, 0, kVocab),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("logprobs: prompts × n × max_tokens × (1 + alternatives) = 1 × "
                                 "2 × 101 × 5 = 1010 log-probability entries; the limit is 1000")));
  r.prompts.resize(2);
  EXPECT_THAT(CheckLogprobBudget(r, 100, l, 0, kVocab),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("= 2 × 2 × 100 × 5 = 2000")));
  r.sampling.set_n(128);
  r.sampling.set_logprobs(20);
  EXPECT_FALSE(CheckLogprobBudget(r, INT32_MAX, l, 0, kVocab).ok());  // no overflow
  // The prompts' logprobs: prompt tokens (all prompts) × n × (1 + alternatives).
  ParsedRequest scored;
  scored.prompt_logprobs = 4;
  scored.sampling.set_n(2);
  EXPECT_OK(CheckLogprobBudget(scored, 1, l, 100, kVocab));
  EXPECT_THAT(CheckLogprobBudget(scored, 1, l, 101, kVocab),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("prompt_logprobs: prompt tokens × n × (1 + alternatives) = 101")));
  ParsedRequest echoed;
  echoed.echo = true;
  echoed.sampling.set_logprobs(9);
  EXPECT_THAT(CheckLogprobBudget(echoed, 0, l, 101, kVocab),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("echo: ")));
}

// --max-logprobs (vLLM's max_logprobs, default 20) caps every alternatives count; -1 is the
// whole vocabulary, counted as its size, and with the cap off it is served.
TEST(OpenAiRequestTest, MaxLogprobsCapsAlternatives) {
  constexpr int64_t kVocab = 500;
  RequestLimits l;
  ParsedRequest chat;
  chat.chat = true;
  chat.sampling.set_logprobs(20);
  EXPECT_OK(CheckLogprobBudget(chat, 1, l, 0, kVocab));
  chat.sampling.set_logprobs(21);
  EXPECT_THAT(CheckLogprobBudget(chat, 1, l, 0, kVocab),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("top_logprobs: 21 is more alternatives than this server returns: "
                                 "at most 20 (--max-logprobs")));
  chat.sampling.set_logprobs(-1);
  EXPECT_THAT(CheckLogprobBudget(chat, 1, l, 0, kVocab),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("top_logprobs: -1 (the whole vocabulary, 500 ids) is more")));
  l.max_logprobs = 500;  // as vLLM's test: --max-logprobs at the vocabulary's size
  EXPECT_OK(CheckLogprobBudget(chat, 1, l, 0, kVocab));
  l.max_logprobs = -1;
  EXPECT_OK(CheckLogprobBudget(chat, 1, l, 0, kVocab));
  // The whole vocabulary counts against --max-logprob-entries as its size.
  l.max_logprob_entries = 2 * (1 + kVocab) - 1;
  EXPECT_THAT(CheckLogprobBudget(chat, 2, l, 0, kVocab),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("× 2 × 501 = 1002")));
  ParsedRequest completion;
  completion.sampling.set_logprobs(30);
  completion.prompt_logprobs = -1;
  l = RequestLimits{};
  EXPECT_THAT(CheckLogprobBudget(completion, 1, l, 3, kVocab),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("logprobs: 30 is more")));
  completion.sampling.set_logprobs(3);
  EXPECT_THAT(CheckLogprobBudget(completion, 1, l, 3, kVocab),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("prompt_logprobs: -1 (the whole vocabulary, 500 ids)")));
  l.max_logprobs = -1;
  EXPECT_OK(CheckLogprobBudget(completion, 1, l, 3, kVocab));
  completion.echo = true;  // echo with logprobs scores the prompt with the wider of the two
  EXPECT_EQ(completion.worker_prompt_logprobs(), -1);
}

// A list of prompts: strings or token-id lists, each answered on its own; limits on their count
// and their bytes in all; echo allows max_tokens 0 and returns the prompt's logprobs with
// logprobs.
TEST(OpenAiRequestTest, ListsOfPromptsAndEcho) {
  RequestLimits l;
  l.max_prompts = 3;
  l.max_prompt_bytes = 10;
  l.max_prompt_ids = 4;
  auto parse = [&](json body) {
    body["model"] = "m";
    return ParseCompletionRequest(body.dump(), false, l);
  };
  ASSERT_OK_AND_ASSIGN(ParsedRequest r, parse({{"prompt", {"ab", "cd", "e"}}}));
  ASSERT_EQ(r.prompts.size(), 3u);
  EXPECT_EQ(*r.prompts[1].text, "cd");
  ASSERT_OK_AND_ASSIGN(r, parse({{"prompt", {{1, 2}, {3}}}}));
  ASSERT_EQ(r.prompts.size(), 2u);
  EXPECT_EQ(r.prompts[1].ids, std::vector<int32_t>{3});
  EXPECT_FALSE(r.prompts[1].text);
  ASSERT_OK_AND_ASSIGN(r, parse({{"prompt", json::array({"ab", {5, 6}})}}));
  EXPECT_EQ(r.prompts[1].ids, (std::vector<int32_t>{5, 6}));
  struct Bad {
    json prompt;
    const char* message;
  };
  for (const Bad& b : std::vector<Bad>{
           {{"a", "b", "c", "d"}, "prompt: has 4 prompts; the limit is 3 (--max-prompts)"},
           {{"abcdef", "ghijk"}, "prompt: has over 11 bytes of text; the limit is 10"},
           {{{1}, json::array()}, "prompt[1]: must not be empty"},
           {{{1}, {1, 2, 3, 4, 5}}, "prompt[1]: has 5 token ids"},
           {json::array({"a", 1}), "prompt[1]: must be a string or a list of token ids"},
           {json::array({{1}, {-1}}), "prompt[1]: token ids must be non-negative"},
           {json::array(), "prompt: must be a string"},
       }) {
    EXPECT_THAT(parse({{"prompt", b.prompt}}).status(),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(b.message)))
        << b.prompt;
  }
  ASSERT_OK_AND_ASSIGN(r, parse({{"prompt", "x"}, {"echo", true}, {"max_tokens", 0}}));
  EXPECT_TRUE(r.echo);
  EXPECT_EQ(r.max_tokens, 0);
  EXPECT_FALSE(r.worker_prompt_logprobs()) << "echo alone scores nothing";
  ASSERT_OK_AND_ASSIGN(r, parse({{"prompt", "x"}, {"echo", true}, {"logprobs", 3}}));
  EXPECT_EQ(r.worker_prompt_logprobs(), 3);
  ASSERT_OK_AND_ASSIGN(
      r, parse({{"prompt", "x"}, {"echo", true}, {"logprobs", 3}, {"prompt_logprobs", 5}}));
  EXPECT_EQ(r.worker_prompt_logprobs(), 5);
  ASSERT_OK_AND_ASSIGN(r, parse({{"prompt", "x"}, {"prompt_logprobs", 0}}));
  EXPECT_EQ(r.worker_prompt_logprobs(), 0);
}

// Structured outputs: vLLM's guided_regex and guided_choice, and structured_outputs' regex and
// choice, compiled while parsing so that a bad pattern is a 400 naming the parameter.
TEST(OpenAiRequestTest, ParsesConstraints) {
  auto parse = [](json extra, bool chat = false) {
    json body = testing::MinimalBody(chat);
    body.update(extra);
    return ParseCompletionRequest(body.dump(), chat);
  };
  ASSERT_OK_AND_ASSIGN(ParsedRequest r, parse({{"guided_regex", "[0-9]+"}}));
  ASSERT_TRUE(r.constraint);
  EXPECT_EQ(r.constraint->regex, "[0-9]+");
  ASSERT_OK_AND_ASSIGN(r, parse({{"guided_choice", {"yes", "no"}}}, true));
  EXPECT_EQ(r.constraint->kind, structured::ConstraintSpec::Kind::kChoice);
  EXPECT_EQ(r.constraint->choices, (std::vector<std::string>{"yes", "no"}));
  ASSERT_OK_AND_ASSIGN(r, parse({{"structured_outputs", {{"regex", "a|b"}}}}));
  EXPECT_EQ(r.constraint->regex, "a|b");
  ASSERT_OK_AND_ASSIGN(r, parse({{"structured_outputs", {{"choice", {"x"}}}}}));
  EXPECT_EQ(r.constraint->choices, std::vector<std::string>{"x"});
  ASSERT_OK_AND_ASSIGN(r, parse(json::object()));
  EXPECT_FALSE(r.constraint);
  // JSON: a schema as an object or a string; json_object; OpenAI's response_format.
  const json schema = {{"type", "object"},
                       {"properties", {{"b", {{"type", "integer"}}}, {"a", true}}}};
  for (const json& extra :
       {json{{"guided_json", schema}}, json{{"guided_json", schema.dump()}},
        json{{"structured_outputs", {{"json", schema}}}},
        json{{"response_format",
              {{"type", "json_schema"},
               {"json_schema", {{"name", "n"}, {"schema", schema}, {"strict", true}}}}}}}) {
    ASSERT_OK_AND_ASSIGN(r, parse(extra, true));
    ASSERT_TRUE(r.constraint) << extra;
    EXPECT_EQ(r.constraint->kind, structured::ConstraintSpec::Kind::kJsonSchema);
    EXPECT_EQ(r.constraint->json_schema, schema.dump()) << "keys keep their order";
  }
  for (const json& extra : {json{{"response_format", {{"type", "json_object"}}}},
                            json{{"structured_outputs", {{"json_object", true}}}}}) {
    ASSERT_OK_AND_ASSIGN(r, parse(extra));
    EXPECT_EQ(r.constraint->kind, structured::ConstraintSpec::Kind::kJsonObject) << extra;
  }
  ASSERT_OK_AND_ASSIGN(r, parse({{"guided_grammar", "root ::= [0-9]+"}}));
  EXPECT_EQ(r.constraint->kind, structured::ConstraintSpec::Kind::kGrammar);
  EXPECT_EQ(r.constraint->grammar, "root ::= [0-9]+");
  ASSERT_OK_AND_ASSIGN(r, parse({{"response_format", {{"type", "text"}}}}));
  EXPECT_FALSE(r.constraint);
  // Compact JSON by default; structured_outputs.disable_any_whitespace false asks for any
  // whitespace (on any JSON constraint, guided_json too); disable_fallback asks nothing.
  ASSERT_OK_AND_ASSIGN(r, parse({{"guided_json", schema}}));
  EXPECT_FALSE(r.constraint->any_whitespace);
  ASSERT_OK_AND_ASSIGN(r, parse({{"guided_json", schema},
                                 {"structured_outputs", {{"disable_any_whitespace", false}}}}));
  EXPECT_TRUE(r.constraint->any_whitespace);
  ASSERT_OK_AND_ASSIGN(r, parse({{"structured_outputs",
                                  {{"json_object", true},
                                   {"disable_any_whitespace", true},
                                   {"disable_fallback", true}}}}));
  EXPECT_FALSE(r.constraint->any_whitespace);
  ASSERT_OK_AND_ASSIGN(
      r, parse({{"structured_outputs", {{"regex", "a"}, {"disable_any_whitespace", false}}}}));
  EXPECT_FALSE(r.constraint->any_whitespace) << "whitespace is a JSON matter";
  struct Bad {
    json extra;
    const char* param;
    const char* message;
  };
  for (const Bad& b : std::vector<Bad>{
           {{{"guided_regex", "(a"}}, "guided_regex", "a '(' without its ')' at offset 2"},
           {{{"guided_regex", "(?=a)"}}, "guided_regex", "lookaround is not supported"},
           {{{"guided_regex", "(a|b)*a(a|b){14}"}}, "guided_regex", "too large"},
           {{{"guided_regex", 5}}, "guided_regex", "must be a string"},
           {{{"guided_choice", json::array()}}, "guided_choice", "non-empty list of strings"},
           {{{"guided_choice", {"a", 1}}}, "guided_choice", "must hold strings"},
           {{{"guided_choice", {"a"}}, {"guided_regex", "a"}},
            "guided_choice",
            "only one constraint may be given; guided_regex is too"},
           {{{"structured_outputs", {{"structural_tag", "x"}}}},
            "structured_outputs.structural_tag",
            "not supported by kvserve yet"},
           {{{"guided_grammar", "root ::= x"}}, "guided_grammar", "rule 'x' is not defined"},
           {{{"structured_outputs", {{"grammar", "start ::= \"a\""}}}},
            "structured_outputs.grammar",
            "the grammar has no rule 'root'"},
           {{{"structured_outputs", "a"}}, "structured_outputs", "must be an object"},
           {{{"structured_outputs", {{"regex", "a"}, {"backend", "xgrammar"}}}},
            "structured_outputs.backend",
            "is not a structured_outputs field kvserve serves"},
           {{{"structured_outputs", {{"regex", "a"}, {"whitespace_pattern", " *"}}}},
            "structured_outputs.whitespace_pattern",
            "not supported"},
           {{{"structured_outputs", {{"json_object", true}, {"disable_any_whitespace", 1}}}},
            "structured_outputs.disable_any_whitespace",
            "must be true or false"},
           {{{"guided_json", schema}, {"guided_whitespace_pattern", "[ ]?"}},
            "guided_whitespace_pattern",
            "not supported"},
           {{{"guided_json", {{"type", "object"}, {"properties", {{"a", {{"not", true}}}}}}}},
            "guided_json",
            "unsupported keyword 'not' at #/properties/a"},
           {{{"guided_json", "{"}}, "guided_json", "not valid JSON"},
           {{{"guided_json", 3}}, "guided_json", "must be a JSON schema"},
           {{{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "n"}}}}}},
            "response_format.json_schema.schema",
            "is required"},
           {{{"response_format", {{"type", "json_object"}}}, {"guided_regex", "a"}},
            "response_format",
            "only one constraint may be given"},
           {{{"guided_regex", std::string(70000, 'a')}}, "guided_regex", "the limit is 65536"},
       }) {
    absl::StatusOr<ParsedRequest> bad = parse(b.extra);
    EXPECT_THAT(bad.status(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(b.message)))
        << b.extra;
    if (!bad.ok()) {
      EXPECT_EQ(json::parse(OpenAiErrorFromStatus(bad.status()).json)["error"]["param"], b.param);
    }
  }
}

TEST(OpenAiRequestTest, ErrorShapeForOtherCodes) {
  OpenAiError e = OpenAiErrorFromStatus(absl::UnavailableError("all workers are draining"));
  EXPECT_EQ(e.http_status, 503);
  json j = json::parse(e.json);
  EXPECT_TRUE(j["error"]["param"].is_null());
  e = OpenAiErrorFromStatus(absl::InvalidArgumentError("prompt: too long"),
                            "context_length_exceeded");
  EXPECT_EQ(json::parse(e.json)["error"]["code"], "context_length_exceeded");
  EXPECT_EQ(OpenAiErrorFromStatus(absl::NotFoundError("model 'x' does not exist")).http_status,
            404);
}

}  // namespace
}  // namespace kvserve::frontend
