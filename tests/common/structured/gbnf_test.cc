// GBNF grammars: what compiled grammars accept and refuse, and the errors for bad ones.
#include "common/structured/gbnf.h"

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace kvserve::structured {
namespace {

void Expect(const std::string& text, const std::vector<std::string>& yes,
            const std::vector<std::string>& no) {
  absl::StatusOr<Grammar> g = CompileGbnf(text);
  ASSERT_OK(g) << text;
  GrammarMatcher m(std::make_shared<const Grammar>(*std::move(g)));
  for (const std::string& s : yes) EXPECT_TRUE(m.Matches(s)) << text << " should take " << s;
  for (const std::string& s : no) EXPECT_FALSE(m.Matches(s)) << text << " should refuse " << s;
}

std::string Error(const std::string& text) {
  return std::string(CompileGbnf(text).status().message());
}

TEST(GbnfTest, ArithmeticWithRecursionAndComments) {
  const std::string g = R"g(# expressions
root   ::= expr
expr   ::= term ( [+-] term )*
term   ::= factor ( ("*" | "/") factor )*
factor ::= [0-9]{1,3}
         | "(" expr ")")g";
  Expect(g, {"1", "12+3*4", "(1+2)*(3-4)/5", "((7))"}, {"", "1+", "(1", "1234", "a"});
}

TEST(GbnfTest, TerminalsQuantifiersAndEscapes) {
  Expect(R"(root ::= "é\n" "\x41\u00e9\U0001F600" [^a-z]? .{2} "q"{2,3})",
         {"é\nAé😀xyqq", "é\nAé😀Zxyqqq", "é\nAé😀ééqq"}, {"é\nAé😀axyqq", "é\nAé😀xyq"});
  Expect("root ::= (\"a\" | ) \"b\"+\n", {"b", "abbb"}, {"a", "aab"});
  Expect(R"g(root ::= item ("," item)*
item ::= "x" | "[" root? "]")g",
         {"x", "[],x", "[x,[x]]"}, {"[", "x,", "[x"});
}

TEST(GbnfTest, RefusesBadGrammars) {
  EXPECT_THAT(Error("root ::= \"a"),
              ::testing::HasSubstr("line 1 column 12: expected the closing"));
  EXPECT_THAT(Error("root ::= a\nroot ::= \"b\""), ::testing::HasSubstr("line 2 column 1"));
  EXPECT_THAT(Error("root ::= missing"), ::testing::HasSubstr("rule 'missing' is not defined"));
  EXPECT_THAT(Error("start ::= \"a\""), ::testing::HasSubstr("no rule 'root'"));
  EXPECT_THAT(Error("root ::= root \"a\" | \"b\""), ::testing::HasSubstr("left-recursive"));
  EXPECT_THAT(Error("root ::= \"a\" root"), ::testing::HasSubstr("no finite string"));
  EXPECT_THAT(Error("root ::= \"a\"{3,2}"), ::testing::HasSubstr("{n}, {n,} or {n,m}"));
  EXPECT_THAT(Error("root ::= (\"a\""), ::testing::HasSubstr("expected ')'"));
  EXPECT_THAT(Error("root ::= \"a\")"), ::testing::HasSubstr("unmatched ')'"));
  EXPECT_THAT(Error("root ::= [a-"), ::testing::HasSubstr("closing ']'"));
  EXPECT_THAT(Error("root ::= \"\\q\""), ::testing::HasSubstr("an escape"));
  EXPECT_THAT(Error("root ::= [z-a]"), ::testing::HasSubstr("grammar class [z-a]"));
  EXPECT_THAT(Error("root ::= " + std::string(200, '(') + "\"a\"" + std::string(200, ')')),
              ::testing::HasSubstr("fewer nested groups"));
}

// vLLM's guidance and outlines backends take Lark; kvserve names the notation it takes instead.
TEST(GbnfTest, LarkIsRefusedNamingGbnf) {
  const std::string lark =
      "?start: select_statement\n"
      "?select_statement: \"SELECT \" column_list \" FROM \" table_name\n"
      "?column_list: column_name (\",\" column_name)*\n"
      "?table_name: identifier\n?column_name: identifier\n"
      "?identifier: /[a-zA-Z_][a-zA-Z0-9_]*/\n";
  EXPECT_THAT(Error(lark), ::testing::HasSubstr("Lark notation"));
  EXPECT_THAT(Error(lark), ::testing::HasSubstr("root ::="));
  EXPECT_THAT(Error("%import common.WS\nroot ::= \"a\""), ::testing::HasSubstr("Lark notation"));
  // Not Lark: the plain GBNF message.
  EXPECT_THAT(Error("root ::= \"a"), ::testing::Not(::testing::HasSubstr("Lark")));
}

}  // namespace
}  // namespace kvserve::structured
