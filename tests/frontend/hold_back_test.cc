#include "frontend/output/hold_back.h"

#include "gtest/gtest.h"

namespace kvserve::frontend {
namespace {

TEST(HoldBackTest, PartialMatchIsTheLongestSuffixThatStartsThePattern) {
  EXPECT_EQ(PartialMatchLength("hello </th", "</think>"), 4u);
  EXPECT_EQ(PartialMatchLength("hello <", "</think>"), 1u);
  EXPECT_EQ(PartialMatchLength("hello", "</think>"), 0u);
  EXPECT_EQ(PartialMatchLength("</think", "</think>"), 7u);   // a proper prefix at most
  EXPECT_EQ(PartialMatchLength("</think>", "</think>"), 0u);  // whole: a match, not a hold
  EXPECT_EQ(PartialMatchLength("aaa", "aab"), 2u);
  EXPECT_EQ(PartialMatchLength("", "x"), 0u);
  EXPECT_EQ(PartialMatchLength("abc", ""), 0u);
}

TEST(HoldBackTest, HoldBackIsTheLongestOverThePatterns) {
  EXPECT_EQ(HoldBackLength("end of te", {"text", "e", "##"}), 2u);
  EXPECT_EQ(HoldBackLength("end #", {"text", "##"}), 1u);
  EXPECT_EQ(HoldBackLength("anything", {}), 0u);
}

}  // namespace
}  // namespace kvserve::frontend
