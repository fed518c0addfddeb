#include "common/tokenizer/chat_template.h"

#include "common/json_text.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace kvserve::tokenizer {
namespace {

using ::kvserve::testing::StatusIs;
using ::testing::HasSubstr;

TEST(ChatTemplateTest, DetectsFamilies) {
  ASSERT_OK_AND_ASSIGN(ChatTemplate l, ChatTemplate::Detect("...<|start_header_id|>...", "<bos>"));
  EXPECT_EQ(l.family(), ChatTemplate::Family::kLlama3);
  ASSERT_OK_AND_ASSIGN(ChatTemplate l31,
                       ChatTemplate::Detect("<|start_header_id|> Cutting Knowledge Date", ""));
  EXPECT_EQ(l31.family(), ChatTemplate::Family::kLlama31);
  ASSERT_OK_AND_ASSIGN(ChatTemplate c, ChatTemplate::Detect("{{ '<|im_start|>' }}", ""));
  EXPECT_EQ(c.family(), ChatTemplate::Family::kChatMl);
  EXPECT_THAT(ChatTemplate::Detect("", ""),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no chat_template")));
  EXPECT_THAT(ChatTemplate::Detect("[INST]", ""),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("neither")));
}

TEST(ChatTemplateTest, Llama3) {
  ChatTemplate t = ChatTemplate::ForFamily(ChatTemplate::Family::kLlama3, "<|begin_of_text|>");
  ASSERT_OK_AND_ASSIGN(std::string out,
                       t.Render({{"system", "Be brief.", {}}, {"user", "  Hi!\n", {}}}, {}));
  EXPECT_EQ(out,
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplateTest, Llama31ToolsInTheFirstUserTurn) {
  ChatTemplate t = ChatTemplate::ForFamily(ChatTemplate::Family::kLlama31, "<bos>");
  ChatRenderOptions options;
  options.tools = {R"({"type":"function","function":{"name":"f","parameters":{}}})"};
  options.date_string = "01 Dec 2026";
  ASSERT_OK_AND_ASSIGN(std::string out, t.Render({{"user", " Q ", {}}}, options));
  EXPECT_EQ(out,
            "<bos><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\n"
            "Cutting Knowledge Date: December 2023\nToday Date: 01 Dec 2026\n\n<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please "
            "respond with a JSON for a function call with its proper arguments that best answers "
            "the given prompt.\n\nRespond in the format {\"name\": function name, \"parameters\": "
            "dictionary of argument name and its value}.Do not use variables.\n\n{\n    \"type\": "
            "\"function\",\n    \"function\": {\n        \"name\": \"f\",\n        \"parameters\": "
            "{}\n    }\n}\n\nQ<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_THAT(t.Render({{"system", "S", {}}}, options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("first user message")));
}

TEST(ChatTemplateTest, ChatMlWithThinking) {
  ChatTemplate t = ChatTemplate::ForFamily(ChatTemplate::Family::kChatMl, "");
  std::vector<ChatMessage> m = {{"system", "S", {}},
                                {"user", "Q1", {}},
                                {"assistant", "<think>\nr1\n</think>\n\nA1", {}},
                                {"user", "Q2", {}}};
  ChatRenderOptions no_think;
  no_think.enable_thinking = false;
  ASSERT_OK_AND_ASSIGN(std::string out, t.Render(m, no_think));
  EXPECT_EQ(out,
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ1<|im_end|>\n"
            "<|im_start|>assistant\nA1<|im_end|>\n<|im_start|>user\nQ2<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\n");
}

TEST(ChatTemplateTest, ChatMlTools) {
  ChatTemplate t = ChatTemplate::ForFamily(ChatTemplate::Family::kChatMl, "");
  ChatMessage call{"assistant", "", {}, {{"call_1", "f", R"({"a":[1,"é"]})"}}, ""};
  ChatRenderOptions options;
  options.tools = {R"({"type":"function","function":{"name":"f"}})"};
  ASSERT_OK_AND_ASSIGN(
      std::string out,
      t.Render({{"user", "Q", {}}, call, {"tool", "R", {}, {}, "call_1"}}, options));
  EXPECT_THAT(out, HasSubstr("<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"f\"}}\n"
                             "</tools>"));
  EXPECT_THAT(out, HasSubstr("<|im_start|>assistant\n<tool_call>\n{\"name\": \"f\", \"arguments\": "
                             "{\"a\": [1, \"é\"]}}\n</tool_call><|im_end|>\n<|im_start|>user\n"
                             "<tool_response>\nR\n</tool_response><|im_end|>\n"));
  call.tool_calls[0].arguments = "{oops";
  EXPECT_THAT(t.Render({{"user", "Q", {}}, call}, {}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("messages[1].tool_calls[0].function.arguments")));
}

TEST(ChatTemplateTest, PythonJsonText) {
  ASSERT_OK_AND_ASSIGN(std::string text,
                       PythonJsonText(R"({"b":1.5,"a":{},"c":[],"d":"\u0001\"\n"})"));
  EXPECT_EQ(text, R"({"b": 1.5, "a": {}, "c": [], "d": "\u0001\"\n"})");
  EXPECT_THAT(PythonJsonText(std::string(600, '[') + std::string(600, ']')),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("deeper")));
  EXPECT_THAT(PythonJsonText("{"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("JSON")));
}

TEST(ChatTemplateTest, RejectsBadMessages) {
  ChatTemplate t = ChatTemplate::ForFamily(ChatTemplate::Family::kChatMl, "");
  EXPECT_THAT(t.Render({}, {}), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("empty")));
  EXPECT_THAT(t.Render({{"wizard", "x", {}}}, {}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("messages[0].role: 'wizard' is not one of system")));
  ChatTemplate llama = ChatTemplate::ForFamily(ChatTemplate::Family::kLlama3, "");
  EXPECT_THAT(
      llama.Render({{"user", "x", {}}, {"bad\n<|eot_id|>", "x", {}}}, {}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("messages[1].role: a custom")));
  EXPECT_THAT(llama.Render({{"", "x", {}}}, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("messages[0].role")));
}

// Llama 3's templates write a custom role into its header as they find it (vLLM passes roles to
// the template, which decides); 3.1's reads `ipython` as a tool result.
TEST(ChatTemplateTest, LlamaRendersCustomRoles) {
  ChatTemplate llama3 = ChatTemplate::ForFamily(ChatTemplate::Family::kLlama3, "<B>");
  ASSERT_OK_AND_ASSIGN(std::string text,
                       llama3.Render({{"narrator", " Once. ", {}}, {"user", "Hi", {}}}, {}));
  EXPECT_EQ(text,
            "<B><|start_header_id|>narrator<|end_header_id|>\n\nOnce.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  ChatTemplate llama31 = ChatTemplate::ForFamily(ChatTemplate::Family::kLlama31, "<B>");
  ChatRenderOptions o;
  o.date_string = "1 Jan 2026";
  ASSERT_OK_AND_ASSIGN(std::string with_tool,
                       llama31.Render({{"user", "Hi", {}}, {"ipython", "42", {}}}, o));
  ASSERT_OK_AND_ASSIGN(std::string with_ipython,
                       llama31.Render({{"user", "Hi", {}}, {"tool", "42", {}}}, o));
  EXPECT_EQ(with_tool, with_ipython);
  EXPECT_NE(with_tool.find("<|start_header_id|>ipython<|end_header_id|>\n\n\"42\"<|eot_id|>"),
            std::string::npos);
  ASSERT_OK_AND_ASSIGN(std::string custom,
                       llama31.Render({{"user", "Hi", {}}, {"critic", "ok", {}}}, o));
  EXPECT_NE(custom.find("<|start_header_id|>critic<|end_header_id|>\n\nok<|eot_id|>"),
            std::string::npos);
}

}  // namespace
}  // namespace kvserve::tokenizer
