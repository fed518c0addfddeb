// The reasoning splitter: the same parts however the text is cut into pieces, tags split across
// pieces, outputs that start inside the block, never open it or never close it.
#include "frontend/output/reasoning.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace kvserve::frontend {
namespace {

// The parts of `text` fed in pieces of `step` bytes.
ReasoningSplitter::Parts Split(const std::string& text, size_t step, bool inside) {
  ReasoningSplitter s(ReasoningTags{"<think>", "</think>"}, inside);
  ReasoningSplitter::Parts all;
  auto add = [&](const ReasoningSplitter::Parts& p) {
    all.reasoning += p.reasoning;
    all.content += p.content;
  };
  for (size_t i = 0; i < text.size(); i += step) add(s.Append(text.substr(i, step)));
  add(s.Finish());
  return all;
}

TEST(ReasoningTest, SplitsTheSameInAnyPieces) {
  struct Case {
    std::string text;
    bool inside;
    std::string reasoning, content;
  };
  for (const Case& c : std::vector<Case>{
           {"<think>\nhm, </thin> no</think>\n\n{\"a\": 1}", false, "\nhm, </thin> no",
            "\n\n{\"a\": 1}"},
           {"{\"a\": 1} <think>x</think>", false, "", "{\"a\": 1} <think>x</think>"},
           {"<thin", false, "", "<thin"},
           {"<think>cut off", false, "cut off", ""},
           {"still thinking</think>answer", true, "still thinking", "answer"},
           {"</think>", true, "", ""},
           {"", false, "", ""},
       }) {
    for (size_t step : {1, 2, 3, 7, 100}) {
      const ReasoningSplitter::Parts p = Split(c.text, step, c.inside);
      EXPECT_EQ(p.reasoning, c.reasoning) << c.text << " step " << step;
      EXPECT_EQ(p.content, c.content) << c.text << " step " << step;
    }
  }
}

TEST(ReasoningTest, HoldsBackOnlyWhatMayBeATag) {
  ReasoningSplitter s(ReasoningTags{"<think>", "</think>"}, false);
  EXPECT_EQ(s.Append("<thi").reasoning, "");
  EXPECT_EQ(s.Append("nk>abc</th").reasoning, "abc");
  const ReasoningSplitter::Parts p = s.Append("ink>ok");
  EXPECT_EQ(p.reasoning, "");
  EXPECT_EQ(p.content, "ok");
}

TEST(ReasoningTest, ParsersAndPrompts) {
  ASSERT_OK_AND_ASSIGN(ReasoningTags tags, ReasoningTagsFor("qwen3"));
  EXPECT_EQ(tags.start, "<think>");
  EXPECT_OK(ReasoningTagsFor("deepseek_r1").status());
  EXPECT_THAT(ReasoningTagsFor("granite").status().message(),
              ::testing::HasSubstr("unknown parser 'granite'"));
  EXPECT_TRUE(PromptOpensReasoning("<|im_start|>assistant\n<think>\n", tags));
  EXPECT_FALSE(PromptOpensReasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n", tags));
  EXPECT_FALSE(PromptOpensReasoning("<|im_start|>assistant\n", tags));
}

}  // namespace
}  // namespace kvserve::frontend
