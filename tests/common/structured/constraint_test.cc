// Constraints as a request states them (common/structured/constraint.h): each kind compiled to
// the grammar the worker runs, its refusals, its cache key, and the reasoning block before it.
#include "common/structured/constraint.h"

#include <memory>
#include <string>
#include <vector>

#include "common/structured/grammar.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace kvserve::structured {
namespace {

using Kind = ConstraintSpec::Kind;

GrammarMatcher Matcher(Grammar g) {
  return GrammarMatcher(std::make_shared<const Grammar>(std::move(g)));
}

TEST(ConstraintTest, EachKindAcceptsItsLanguage) {
  struct Case {
    ConstraintSpec spec;
    std::vector<std::string> yes, no;
  };
  const std::vector<Case> cases = {
      {{.kind = Kind::kRegex, .regex = "\\d{3}"}, {"123", "000"}, {"12", "1234", "abc"}},
      {{.kind = Kind::kChoice, .choices = {"red", "green", "ré"}},
       {"red", "green", "ré"},
       {"re", "redgreen", "blue", ""}},
      {{.kind = Kind::kJsonSchema, .json_schema = R"({"type": "boolean"})"},
       {"true", "false"},
       {"1", "\"true\"", "tru"}},
      {{.kind = Kind::kJsonObject}, {"{}", R"({"a": [1, {"b": null}]})"}, {"[]", "1", "{"}},
      {{.kind = Kind::kGrammar, .grammar = "root ::= \"a\" root | \"b\""},
       {"b", "aab"},
       {"a", "ba", ""}},
  };
  for (const Case& c : cases) {
    ASSERT_OK_AND_ASSIGN(Grammar g, CompileConstraint(c.spec));
    GrammarMatcher m = Matcher(std::move(g));
    for (const std::string& s : c.yes) EXPECT_TRUE(m.Matches(s)) << c.spec.Key() << " " << s;
    for (const std::string& s : c.no) EXPECT_FALSE(m.Matches(s)) << c.spec.Key() << " " << s;
  }
}

TEST(ConstraintTest, RefusalsSayWhatIsWrong) {
  const std::vector<std::pair<ConstraintSpec, std::string>> cases = {
      {{.kind = Kind::kChoice}, "the list of choices is empty"},
      {{.kind = Kind::kChoice, .choices = {"ok", "\xff"}}, "choice 1 is not valid UTF-8"},
      {{.kind = Kind::kRegex, .regex = "(a"}, ""},
      {{.kind = Kind::kJsonSchema, .json_schema = "{not json"}, ""},
      {{.kind = Kind::kGrammar, .grammar = "root ::= missing"}, "missing"},
  };
  for (const auto& [spec, message] : cases) {
    const absl::Status s = CompileConstraint(spec).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << spec.Key() << " " << s;
    EXPECT_THAT(s.message(), ::testing::HasSubstr(message)) << spec.Key();
  }
}

// The key tells every two different constraints apart (it names a compiled grammar in caches),
// choices included: a list's entries are length-prefixed, so no joining of them collides.
TEST(ConstraintTest, KeysTellConstraintsApart) {
  const std::vector<ConstraintSpec> specs = {
      {.kind = Kind::kRegex, .regex = "a"},
      {.kind = Kind::kJsonSchema, .json_schema = "a"},
      {.kind = Kind::kGrammar, .grammar = "a"},
      {.kind = Kind::kJsonObject},
      {.kind = Kind::kChoice, .choices = {"a:b"}},
      {.kind = Kind::kChoice, .choices = {"a", "b"}},
      {.kind = Kind::kChoice, .choices = {"a:1:b"}},
  };
  for (size_t i = 0; i < specs.size(); ++i) {
    EXPECT_EQ(specs[i].Key(), specs[i].ContentKey());  // no reasoning block
    for (size_t j = i + 1; j < specs.size(); ++j) {
      EXPECT_NE(specs[i].Key(), specs[j].Key()) << i << " " << j;
    }
  }
  ConstraintSpec spaced{.kind = ConstraintSpec::Kind::kJsonObject, .any_whitespace = true};
  EXPECT_NE(spaced.Key(), ConstraintSpec{.kind = ConstraintSpec::Kind::kJsonObject}.Key());
  ConstraintSpec with = specs[0];
  with.reasoning = {"<think>", "</think>", false};
  EXPECT_NE(with.Key(), specs[0].Key());
  EXPECT_EQ(with.ContentKey(), specs[0].ContentKey());
}

// A constraint after a reasoning block: the block is free text up to its end tag, and may be
// left out unless the prompt opened it.
TEST(ConstraintTest, HoldsAfterTheReasoningBlock) {
  ConstraintSpec spec{.kind = ConstraintSpec::Kind::kJsonSchema,
                      .json_schema = R"({"type": "integer", "maximum": 9})"};
  spec.reasoning = {"<think>", "</think>", false};
  ASSERT_OK_AND_ASSIGN(Grammar g, CompileConstraint(spec));
  GrammarMatcher m = Matcher(std::move(g));
  for (const char* yes : {"7", "<think>hm <think> </thin </think>\n\n7", "<think></think>3"}) {
    EXPECT_TRUE(m.Matches(yes)) << yes;
  }
  for (const char* no :
       {"<think>7", "<think>a</think>10", "x</think>7", "<think>a</think>b</think>7"}) {
    EXPECT_FALSE(m.Matches(no)) << no;
  }
  spec.reasoning.inside = true;
  ASSERT_OK_AND_ASSIGN(g, CompileConstraint(spec));
  GrammarMatcher inside = Matcher(std::move(g));
  EXPECT_TRUE(inside.Matches("thinking</think> 5"));
  EXPECT_FALSE(inside.Matches("5"));
  ConstraintSpec plain = spec;
  plain.reasoning = {};
  EXPECT_NE(spec.Key(), plain.Key());
  spec.reasoning.end = std::string(65, 'x');
  EXPECT_THAT(CompileConstraint(spec).status().message(), ::testing::HasSubstr("1 to 64 bytes"));
}

}  // namespace
}  // namespace kvserve::structured
