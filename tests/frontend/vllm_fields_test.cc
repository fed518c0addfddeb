// The request fields vLLM serves beyond OpenAI's, as vLLM's own tests see them: each served, or
// refused with a 400 naming it (never silently ignored); the output options; every field of
// vLLM's ChatCompletionRequest and CompletionRequest walked.
#include <string>
#include <vector>

#include "frontend/output/openai_error.h"
#include "frontend/request/openai_request.h"
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
using testing::MinimalBody;

// Parameters kvserve does not serve are refused, naming them, as soon as they ask for
// anything; their neutral values (what clients send by default) pass.
TEST(OpenAiRequestTest, UnservedParametersAreRefusedUnlessNeutral) {
  struct Case {
    json extra;
    bool chat;
    const char* param;  // nullptr: accepted
  };
  const std::vector<Case> cases = {
      {{{"use_beam_search", true}}, false, "use_beam_search"},
      {{{"echo", true}, {"max_tokens", 0}}, true, "max_tokens"},  // completions' alone
      {{{"prompt_logprobs", 1}, {"stream", true}}, true, "prompt_logprobs"},
      {{{"prompt_logprobs", 1}, {"stream", true}}, false, "prompt_logprobs"},
      {{{"prompt_logprobs", -2}}, false, "prompt_logprobs"},
      {{{"max_tokens", 0}}, false, "max_tokens"},
      {{{"response_format", {{"type", "yaml"}}}}, true, "response_format.type"},
      {{{"response_format", "json"}}, true, "response_format"},
      {{{"functions", {{{"name", "f"}}}}}, true, "functions"},
      {{{"suffix", "end"}}, false, "suffix"},
      {{{"best_of", 3}}, false, "best_of"},
      {{{"best_of", 1}, {"n", 2}}, false, "best_of"},
      {{{"presence_penalty", 0},
        {"frequency_penalty", 0},
        {"repetition_penalty", 1},
        {"min_tokens", 0},
        {"logit_bias", json::object()},
        {"bad_words", json::array()},
        {"echo", false},
        {"response_format", {{"type", "text"}}},
        {"prompt_logprobs", 0},
        {"suffix", ""},
        {"best_of", 2},
        {"n", 2}},
       false,
       nullptr},
      {{{"tool_choice", "none"}, {"logit_bias", nullptr}}, true, nullptr},
      // What vLLM refuses (issue 42): an empty tools list, tool_choice other than "none"
      // without tools, stream_options without streaming, an empty cache_salt.
      {{{"tools", json::array()}, {"tool_choice", "none"}}, true, "tools"},
      {{{"tool_choice", "auto"}}, true, "tool_choice"},
      {{{"stream_options", {{"include_usage", true}}}}, false, "stream_options"},
      {{{"stream_options", {{"include_usage", true}}}, {"stream", false}}, true, "stream_options"},
      {{{"cache_salt", ""}}, false, "cache_salt"},
      // vLLM's extensions not served yet: refused by name when they ask for anything.
      {{{"return_token_ids", 1}}, true, "return_token_ids"},
      {{{"return_tokens_as_token_ids", 1}}, true, "return_tokens_as_token_ids"},
      {{{"stream", true},
        {"stream_options", {{"continuous_usage_stats", true}, {"include_usage", false}}}},
       true,
       nullptr},
      {{{"stream", true}, {"stream_options", {{"continuous_usage_stats", "yes"}}}},
       false,
       "stream_options.continuous_usage_stats"},
      {{{"stream", true}, {"stream_options", {{"continuous_usage_stats", true}}}}, true, nullptr},
      {{{"stream", true}, {"stream_options", {{"include_obfuscation", false}}}},
       false,
       "stream_options.include_obfuscation"},
      {{{"return_token_ids", false},
        {"return_tokens_as_token_ids", false},
        {"stream", true},
        {"stream_options", {{"include_usage", true}, {"continuous_usage_stats", false}}},
        {"cache_salt", "tenant-1"}},
       true,
       nullptr},
  };
  for (const Case& c : cases) ExpectParam(c.extra, c.chat, c.param);
}

// vLLM's logprob_token_ids (PR #43463, validated as its fix PR #49320 does): with logprobs on,
// the given ids replace the top alternatives; refused, naming it, without logprobs, empty, past
// 20 ids, not a list of ids, or with nothing generated (echo with max_tokens 0).
TEST(OpenAiRequestTest, LogprobTokenIdsAsVllmValidatesThem) {
  auto parse = [](json extra, bool chat) {
    json body = MinimalBody(chat);
    body.update(extra);
    return ParseCompletionRequest(body.dump(), chat);
  };
  ASSERT_OK_AND_ASSIGN(
      ParsedRequest chat,
      parse({{"logprobs", true}, {"top_logprobs", 5}, {"logprob_token_ids", {9, 5}}}, true));
  EXPECT_THAT(chat.sampling.logprob_token_ids(), ::testing::ElementsAre(9, 5));
  EXPECT_EQ(chat.alternatives(), 2);
  ASSERT_OK_AND_ASSIGN(ParsedRequest legacy,
                       parse({{"logprobs", 0}, {"logprob_token_ids", {7}}}, false));
  EXPECT_EQ(legacy.alternatives(), 1);
  ASSERT_OK_AND_ASSIGN(ParsedRequest unset,
                       parse({{"logprobs", 3}, {"logprob_token_ids", nullptr}}, false));
  EXPECT_EQ(unset.alternatives(), 3);
  const struct {
    json extra;
    bool chat;
    const char* says;
  } refused[] = {
      {{{"logprob_token_ids", {5}}}, true, "logprob_token_ids: needs logprobs: true"},
      {{{"logprobs", false}, {"logprob_token_ids", {5}}}, true, "needs logprobs: true"},
      {{{"logprob_token_ids", {5}}}, false, "logprob_token_ids: needs logprobs set"},
      {{{"logprobs", true}, {"logprob_token_ids", json::array()}}, true, "must not be empty"},
      {{{"logprobs", 1}, {"logprob_token_ids", 123}}, false, "must be a list of token ids"},
      {{{"logprobs", 1}, {"logprob_token_ids", {-1}}}, false, "non-negative"},
      {{{"logprobs", 1}, {"logprob_token_ids", std::vector<int>(21, 4)}},
       false,
       "has 21 ids; the limit is 20"},
      {{{"logprobs", 1}, {"echo", true}, {"max_tokens", 0}, {"logprob_token_ids", {5}}},
       false,
       "with echo and max_tokens 0 there are none"},
  };
  for (const auto& c : refused) {
    EXPECT_THAT(parse(c.extra, c.chat).status(),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.says)))
        << c.extra;
  }
}

// continuous_usage_stats has no effect without include_usage (vLLM: usage in no chunk), and
// turns include_usage on when it is not given.
TEST(OpenAiRequestTest, ContinuousUsageStatsNeedsIncludeUsageToDoAnything) {
  auto parse = [](json options) {
    json body = MinimalBody(true);
    body.update({{"stream", true}, {"stream_options", options}});
    return ParseCompletionRequest(body.dump(), true);
  };
  ASSERT_OK_AND_ASSIGN(ParsedRequest off,
                       parse({{"continuous_usage_stats", true}, {"include_usage", false}}));
  EXPECT_FALSE(off.include_usage);
  EXPECT_FALSE(off.continuous_usage);
  ASSERT_OK_AND_ASSIGN(ParsedRequest on, parse({{"continuous_usage_stats", true}}));
  EXPECT_TRUE(on.include_usage);
  EXPECT_TRUE(on.continuous_usage);
}

// Chat's logprobs as vLLM's pydantic validation reads it: "true" (a string) is true (its
// test_top_logprobs sends that); top_logprobs -1, the whole vocabulary, passes the parser
// (--max-logprobs decides: CheckLogprobBudget); below -1 is refused.
TEST(OpenAiRequestTest, ChatLogprobsIsReadAsVllmReadsABool) {
  auto parse = [](json extra) {
    json body = MinimalBody(true);
    body.update(extra);
    return ParseCompletionRequest(body.dump(), true);
  };
  for (const json& yes : {json("true"), json("TRUE"), json("y"), json(1), json(true)}) {
    ASSERT_OK_AND_ASSIGN(ParsedRequest r, parse({{"logprobs", yes}, {"top_logprobs", 5}}));
    EXPECT_EQ(r.sampling.logprobs(), 5) << yes;
  }
  ASSERT_OK_AND_ASSIGN(ParsedRequest off, parse({{"logprobs", "false"}, {"top_logprobs", 5}}));
  EXPECT_EQ(off.sampling.logprobs(), 0);
  EXPECT_THAT(parse({{"logprobs", "maybe"}}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("logprobs: must be true")));
  EXPECT_THAT(parse({{"logprobs", 2}}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("logprobs")));
  ASSERT_OK_AND_ASSIGN(ParsedRequest all, parse({{"logprobs", "true"}, {"top_logprobs", -1}}));
  EXPECT_EQ(all.sampling.logprobs(), -1);
  EXPECT_EQ(all.alternatives(), ParsedRequest::kAllAlternatives);
  EXPECT_THAT(parse({{"logprobs", "true"}, {"top_logprobs", -2}}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("top_logprobs")));
}

TEST(OpenAiRequestTest, VllmOutputOptions) {
  ASSERT_OK_AND_ASSIGN(ParsedRequest r, ParseCompletionRequest(R"({"model": "m", "prompt": "x"})",
                                                               /*chat=*/false));
  EXPECT_TRUE(r.skip_special_tokens);
  EXPECT_FALSE(r.include_stop_str_in_output);
  ASSERT_OK_AND_ASSIGN(r, ParseCompletionRequest(R"({"model": "m", "prompt": "x",
      "skip_special_tokens": false, "include_stop_str_in_output": true})",
                                                 /*chat=*/false));
  EXPECT_FALSE(r.skip_special_tokens);
  EXPECT_TRUE(r.include_stop_str_in_output);
  EXPECT_THAT(
      ParseCompletionRequest(R"({"model": "m", "prompt": "x", "include_stop_str_in_output": 1})",
                             false),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("include_stop_str_in_output")));
}

// continue_final_message (vLLM's): only with add_generation_prompt false, and a final message
// with text.
TEST(OpenAiRequestTest, ContinueFinalMessage) {
  const json messages = {{{"role", "user"}, {"content", "Say hi"}},
                         {{"role", "assistant"}, {"content", "Hi, I am"}}};
  ExpectParam({{"messages", messages}, {"continue_final_message", true}}, true,
              "continue_final_message");
  ExpectParam(
      {{"messages", messages}, {"continue_final_message", true}, {"add_generation_prompt", true}},
      true, "continue_final_message");
  ExpectParam({{"messages", {{{"role", "assistant"}, {"content", ""}}}},
               {"continue_final_message", true},
               {"add_generation_prompt", false}},
              true, "continue_final_message");
  ExpectParam({{"messages", messages}, {"continue_final_message", 1}}, true,
              "continue_final_message");
  json body = {{"model", "m"},
               {"messages", messages},
               {"continue_final_message", true},
               {"add_generation_prompt", false}};
  ASSERT_OK_AND_ASSIGN(ParsedRequest r, ParseCompletionRequest(body.dump(), true));
  EXPECT_TRUE(r.continue_final_message);
  EXPECT_FALSE(r.add_generation_prompt);
}

// return_tokens_as_token_ids: the request's, else the server's default.
TEST(OpenAiRequestTest, ReturnTokensAsTokenIds) {
  ASSERT_OK_AND_ASSIGN(ParsedRequest r, ParseCompletionRequest(R"({"model": "m", "prompt": "x"})",
                                                               /*chat=*/false));
  EXPECT_FALSE(r.return_tokens_as_token_ids);
  RequestLimits limits;
  limits.tokens_as_token_ids = true;
  ASSERT_OK_AND_ASSIGN(r,
                       ParseCompletionRequest(R"({"model": "m", "prompt": "x"})", false, limits));
  EXPECT_TRUE(r.return_tokens_as_token_ids);
  ASSERT_OK_AND_ASSIGN(
      r,
      ParseCompletionRequest(
          R"({"model": "m", "prompt": "x", "return_tokens_as_token_ids": false})", false, limits));
  EXPECT_FALSE(r.return_tokens_as_token_ids);
}

// Every request field of vLLM's ChatCompletionRequest and CompletionRequest (its
// vllm/entrypoints/openai/protocol.py, the fields of mid-2025 plus return_token_ids,
// logprob_token_ids and structured_outputs of later versions), each with a value that asks for
// something: served (the request parses; what it does is tested where it is served) or refused
// with a 400 naming it. A field added here that is neither fails.
TEST(OpenAiRequestTest, EveryVllmFieldIsServedOrRefusedByName) {
  struct Field {
    const char* name;
    json value;
    bool served;
  };
  const json schema = {{"type", "object"}};
  const std::vector<Field> common = {
      {"model", "m", true},
      {"frequency_penalty", 0.5, true},
      {"logit_bias", {{"5", 1}}, true},
      {"max_tokens", 8, true},
      {"n", 2, true},
      {"presence_penalty", 0.5, true},
      {"seed", 7, true},
      {"stop", {"x"}, true},
      {"stream", true, true},
      {"temperature", 0.5, true},
      {"top_p", 0.5, true},
      {"user", "u", true},
      {"use_beam_search", true, false},
      {"top_k", 5, true},
      {"min_p", 0.1, true},
      {"repetition_penalty", 1.2, true},
      {"length_penalty", 0.5, false},
      {"stop_token_ids", {5}, true},
      {"include_stop_str_in_output", true, true},
      {"ignore_eos", true, true},
      {"min_tokens", 2, true},
      {"skip_special_tokens", false, true},
      {"spaces_between_special_tokens", false, true},
      {"truncate_prompt_tokens", 4, true},
      {"truncation_side", "right", true},
      {"allowed_token_ids", {5, 6}, true},
      {"add_special_tokens", false, true},
      {"response_format", {{"type", "json_object"}}, true},
      {"guided_json", schema, true},
      {"guided_regex", "a+", true},
      {"guided_choice", {"a", "b"}, true},
      {"guided_grammar", "root ::= \"a\"", true},
      {"guided_decoding_backend", "xgrammar", false},
      {"guided_whitespace_pattern", " *", false},
      {"priority", 1, true},
      {"request_id", "abc", true},
      {"logits_processors", {"my.Processor"}, false},
      {"return_tokens_as_token_ids", true, true},
      {"cache_salt", "s", true},
      {"kv_transfer_params", {{"do_remote_prefill", true}}, false},
      {"vllm_xargs", {{"k", 1}}, false},
      {"return_token_ids", true, true},
      {"logprob_token_ids", {5}, false},  // (served; needs logprobs)
      {"structured_outputs", {{"regex", "a"}}, true},
  };
  const std::vector<Field> chat_only = {
      {"logprobs", true, true},
      {"top_logprobs", 2, true},
      {"max_completion_tokens", 8, true},
      {"tools", {{{"type", "function"}, {"function", {{"name", "f"}}}}}, true},
      {"tool_choice", "required", false},  // (served; needs tools)
      {"reasoning_effort", "low", false},
      {"include_reasoning", false, false},
      {"parallel_tool_calls", false, true},
      {"best_of", 2, false},
      {"prompt_logprobs", 1, true},
      {"bad_words", {"x"}, true},
      {"echo", true, true},
      {"add_generation_prompt", false, true},
      {"continue_final_message", true, false},  // (served; needs add_generation_prompt false)
      {"documents", {{{"title", "t"}, {"text", "x"}}}, false},
      {"chat_template", "{{ messages }}", false},
      {"chat_template_kwargs", {{"tools_in_user_message", false}}, false},
      {"mm_processor_kwargs", {{"k", 1}}, false},
      {"structural_tag", "{}", false},
  };
  const std::vector<Field> completion_only = {
      {"prompt_embeds", "AAAA", false},
      {"best_of", 2, false},
      {"echo", true, true},
      {"logprobs", 2, true},
      {"suffix", "end", false},
      {"prompt_logprobs", 1, true},
  };
  for (bool chat : {true, false}) {
    std::vector<Field> fields = common;
    for (const Field& f : chat ? chat_only : completion_only) fields.push_back(f);
    for (const Field& f : fields) {
      json body = MinimalBody(chat);
      body[f.name] = f.value;
      if (std::string(f.name) == "stream") body["stream"] = true;
      absl::StatusOr<ParsedRequest> r = ParseCompletionRequest(body.dump(), chat);
      if (f.served) {
        EXPECT_OK(r.status()) << (chat ? "chat " : "completions ") << f.name;
        continue;
      }
      ASSERT_FALSE(r.ok()) << (chat ? "chat " : "completions ") << f.name << " was accepted";
      const std::string param =
          json::parse(OpenAiErrorFromStatus(r.status()).json)["error"]["param"].get<std::string>();
      EXPECT_EQ(param.rfind(f.name, 0), 0u)
          << (chat ? "chat " : "completions ") << f.name << ": " << r.status();
    }
  }
}

}  // namespace
}  // namespace kvserve::frontend
