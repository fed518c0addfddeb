#include "common/tokenizer/chat_template.h"

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace kvserve::tokenizer {
namespace {

using ::kvserve::testing::StatusIs;
using ::testing::HasSubstr;

TEST(ChatTemplateTest, DetectsFamilies) {
  ASSERT_OK_AND_ASSIGN(ChatTemplate l, ChatTemplate::Detect("...<|start_header_id|>...", "<bos>"));
  EXPECT_EQ(l.family(), ChatTemplate::Family::kLlama3);
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

TEST(ChatTemplateTest, RejectsBadMessages) {
  ChatTemplate t = ChatTemplate::ForFamily(ChatTemplate::Family::kChatMl, "");
  EXPECT_THAT(t.Render({}, {}), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("empty")));
  EXPECT_THAT(t.Render({{"wizard", "x", {}}}, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("messages[0].role 'wizard'")));
}

}  // namespace
}  // namespace kvserve::tokenizer
