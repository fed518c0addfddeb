// The pushdown matcher (common/structured/grammar.h) on hand-built grammars: recursion, the
// depth bound, refusals naming the rule, one-rule and prefixed grammars, and the matcher's memo.
#include "common/structured/grammar.h"

#include <memory>
#include <string>
#include <vector>

#include "common/structured/nfa.h"
#include "common/structured/regex.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace kvserve::structured {
namespace {

GrammarMatcher Matcher(Grammar g, int32_t max_depth = 64) {
  return GrammarMatcher(std::make_shared<const Grammar>(std::move(g)), max_depth);
}

// S ::= ( "(" S ")" S )?
absl::StatusOr<Grammar> Parens() {
  GrammarBuilder b;
  const int32_t s = b.Declare("S");
  Nfa& n = b.nfa();
  b.Define(s, n.Optional(n.Concat(n.Concat(n.Literal("("), n.Call(s)),
                                  n.Concat(n.Literal(")"), n.Call(s)))));
  return std::move(b).Build(s);
}

TEST(GrammarTest, BalancedParentheses) {
  ASSERT_OK_AND_ASSIGN(Grammar g, Parens());
  GrammarMatcher m = Matcher(std::move(g));
  for (const char* yes : {"", "()", "(())()", "((()))(()())"}) EXPECT_TRUE(m.Matches(yes)) << yes;
  for (const char* no : {"(", "())", ")(", "(()"}) EXPECT_FALSE(m.Matches(no)) << no;
  const GrammarMatcher::State open = m.Walk(m.start(), "(((");
  ASSERT_NE(open, GrammarMatcher::kDead);
  EXPECT_FALSE(m.accepting(open));
  EXPECT_TRUE(m.has_next(open));
  EXPECT_EQ(m.Walk(m.start(), ")"), GrammarMatcher::kDead);
  EXPECT_EQ(m.Walk(m.start(), "(("), m.Walk(m.start(), "(("));  // memoized: one state
}

TEST(GrammarTest, DepthIsBounded) {
  ASSERT_OK_AND_ASSIGN(Grammar g, Parens());
  GrammarMatcher m = Matcher(std::move(g), /*max_depth=*/4);
  EXPECT_TRUE(m.Matches("((()))"));
  EXPECT_EQ(m.Walk(m.start(), "(((((("), GrammarMatcher::kDead);
}

TEST(GrammarTest, RefusesBadGrammars) {
  {  // A ::= A "x" | "y"
    GrammarBuilder b;
    const int32_t a = b.Declare("A");
    b.Define(a, b.nfa().Alternate(b.nfa().Concat(b.nfa().Call(a), b.nfa().Literal("x")),
                                  b.nfa().Literal("y")));
    EXPECT_THAT(std::move(b).Build(a).status().message(), ::testing::HasSubstr("left-recursive"));
  }
  {  // A ::= "x" A
    GrammarBuilder b;
    const int32_t a = b.Declare("A");
    b.Define(a, b.nfa().Concat(b.nfa().Literal("x"), b.nfa().Call(a)));
    EXPECT_THAT(std::move(b).Build(a).status().message(), ::testing::HasSubstr("no finite"));
  }
  {
    GrammarBuilder b;
    const int32_t a = b.Declare("A");
    b.Declare("B");
    b.Define(a, b.nfa().Call(1));
    EXPECT_THAT(std::move(b).Build(a).status().message(),
                ::testing::HasSubstr("'B' is not defined"));
  }
}

// Two rules calling each other: L ::= "[" (V ("," V)*)? "]"; V ::= "1" | L.
TEST(GrammarTest, MutualRecursion) {
  GrammarBuilder b;
  const int32_t list = b.Declare("L");
  const int32_t value = b.Declare("V");
  Nfa& n = b.nfa();
  const Nfa::Fragment items =
      n.Concat(n.Call(value), n.Star(n.Concat(n.Literal(","), n.Call(value))));
  b.Define(list, n.Concat(n.Concat(n.Literal("["), n.Optional(items)), n.Literal("]")));
  b.Define(value, n.Alternate(n.Literal("1"), n.Call(list)));
  EXPECT_EQ(b.num_rules(), 2);
  ASSERT_OK_AND_ASSIGN(Grammar g, std::move(b).Build(list));
  EXPECT_EQ(g.names, (std::vector<std::string>{"L", "V"}));
  GrammarMatcher m = Matcher(std::move(g));
  for (const char* yes : {"[]", "[1]", "[1,[1,[]],1]", "[[[]]]"})
    EXPECT_TRUE(m.Matches(yes)) << yes;
  for (const char* no : {"", "[", "[1,]", "[,1]", "1", "[]]", "[1 ]"}) {
    EXPECT_FALSE(m.Matches(no)) << no;
  }
  // Every prefix of a sentence is alive; a wrong byte kills it at once.
  const std::string sentence = "[1,[1,[]],1]";
  for (size_t i = 0; i <= sentence.size(); ++i) {
    EXPECT_NE(m.Walk(m.start(), sentence.substr(0, i)), GrammarMatcher::kDead) << i;
  }
  EXPECT_EQ(m.Walk(m.start(), "[1,,"), GrammarMatcher::kDead);
  EXPECT_EQ(m.Next(GrammarMatcher::kDead, '['), GrammarMatcher::kDead);
}

TEST(GrammarTest, SingleRuleAndPrefixedGrammars) {
  ASSERT_OK_AND_ASSIGN(Dfa digits, CompileRegex("[0-9]+"));
  ASSERT_OK_AND_ASSIGN(Dfa prefix, CompileRegex("id="));
  GrammarMatcher one = Matcher(SingleRuleGrammar(digits));
  EXPECT_TRUE(one.Matches("42"));
  EXPECT_FALSE(one.Matches("id=42"));
  EXPECT_FALSE(one.Matches(""));
  ASSERT_OK_AND_ASSIGN(Grammar parens, Parens());
  GrammarMatcher prefixed = Matcher(PrefixedGrammar(std::move(parens), prefix));
  EXPECT_TRUE(prefixed.Matches("id=(())"));
  EXPECT_TRUE(prefixed.Matches("id="));
  EXPECT_FALSE(prefixed.Matches("(())"));
  EXPECT_FALSE(prefixed.Matches("id=("));
}

// The memo grows with what the matcher meets, not with how often: a second walk of the same
// text adds nothing.
TEST(GrammarTest, TheMemoGrowsOnlyWithNewStates) {
  ASSERT_OK_AND_ASSIGN(Grammar g, Parens());
  GrammarMatcher m = Matcher(std::move(g));
  m.Walk(m.start(), "(()(()))");
  const int64_t size = m.size();
  EXPECT_GT(size, 0);
  for (int i = 0; i < 10; ++i) m.Walk(m.start(), "(()(()))");
  EXPECT_EQ(m.size(), size);
}

TEST(GrammarTest, LimitsAreEnforced) {
  GrammarBuilder b(GrammarLimits{.max_rule_states = 3});
  const int32_t a = b.Declare("A");
  b.Define(a, b.nfa().Literal("abcdefgh"));
  const absl::Status s = std::move(b).Build(a).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
}

}  // namespace
}  // namespace kvserve::structured
