// JSON schemas compiled to grammars: what they accept and refuse, checked on texts whose
// validity is known (the matcher itself: grammar_test.cc; the constraint kinds:
// constraint_test.cc).
#include "common/structured/json_schema.h"

#include <memory>
#include <string>
#include <vector>

#include "common/structured/constraint.h"
#include "common/structured/grammar.h"
#include "common/structured/json_terminals.h"
#include "common/structured/regex.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace kvserve::structured {
namespace {

GrammarMatcher Matcher(Grammar g, int32_t max_depth = 64) {
  return GrammarMatcher(std::make_shared<const Grammar>(std::move(g)), max_depth);
}

TEST(JsonTerminalsTest, IntegerRangesAreExact) {
  const std::vector<std::pair<std::optional<int64_t>, std::optional<int64_t>>> ranges = {
      {0, 0},
      {-5, 17},
      {3, 250},
      {-250, -3},
      {99, 101},
      {0, std::nullopt},
      {-12, std::nullopt},
      {std::nullopt, -7},
      {std::nullopt, 45},
      {std::nullopt, std::nullopt},
      {100, 1000}};
  for (const auto& [lo, hi] : ranges) {
    const std::string regex = IntegerRangeRegex(lo, hi);
    ASSERT_OK_AND_ASSIGN(Dfa dfa, CompileRegex(regex));
    for (int64_t x = -1200; x <= 1200; ++x) {
      const bool in = (!lo || x >= *lo) && (!hi || x <= *hi);
      ASSERT_EQ(dfa.Matches(std::to_string(x)), in) << regex << " " << x;
    }
    EXPECT_FALSE(dfa.Matches("-0")) << regex;
    EXPECT_FALSE(dfa.Matches("007")) << regex;
    EXPECT_EQ(dfa.Matches("123456789012"), !hi) << regex;
  }
}

// `text` (JSON) in compact form: no whitespace outside strings but one space after each ',' and
// ':' (the text of numbers and strings kept as written).
std::string Compact(std::string_view text) {
  std::string out;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      out += c;
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') continue;
    out += c;
    if (c == '"') in_string = true;
    if (c == ',' || c == ':') out += ' ';
  }
  return out;
}

class JsonSchemaTest : public ::testing::Test {
 protected:
  static GrammarMatcher Compile(const std::string& schema, bool any_whitespace = true) {
    absl::StatusOr<Grammar> g = CompileJsonSchema(schema, {.any_whitespace = any_whitespace});
    EXPECT_OK(g) << schema;
    return Matcher(g.ok() ? *std::move(g) : SingleRuleGrammar(*CompileRegex("x")));
  }
  // Each valid text is taken as written with any whitespace and in its compact form by the
  // compact grammar; each invalid one is refused by both (compact JSON is a part of the other).
  static void Expect(const std::string& schema, const std::vector<std::string>& valid,
                     const std::vector<std::string>& invalid) {
    GrammarMatcher m = Compile(schema);
    GrammarMatcher compact = Compile(schema, /*any_whitespace=*/false);
    for (const std::string& v : valid) {
      EXPECT_TRUE(m.Matches(v)) << schema << " should take " << v;
      EXPECT_TRUE(compact.Matches(Compact(v))) << schema << " should take " << Compact(v);
      if (Compact(v) != v) {
        EXPECT_FALSE(compact.Matches(v)) << schema << " (compact) should refuse " << v;
      }
    }
    for (const std::string& v : invalid) {
      EXPECT_FALSE(m.Matches(v)) << schema << " should refuse " << v;
      EXPECT_FALSE(compact.Matches(v)) << schema << " (compact) should refuse " << v;
    }
  }
  static std::string Refusal(const std::string& schema) {
    return std::string(CompileJsonSchema(schema).status().message());
  }
};

TEST_F(JsonSchemaTest, Objects) {
  Expect(R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 5},
             "age": {"type": "integer", "minimum": 0, "maximum": 120}},
             "required": ["name"], "additionalProperties": false})",
         {R"({"name":"bob","age":42})", R"({"name":"bob"})",
          "{ \"name\" : \"b\\u00e9\" ,\n \"age\" : 7 }", R"({"name":""})"},
         {R"({"age":4})", R"({"name":"toolong"})", R"({"name":"a","age":121})",
          R"({"name":"a","age":-1})", R"({"age":3,"name":"a"})", R"({"name":"a",})", "{}"});
  Expect(R"({"type": "object", "properties": {"a": {"type": "boolean"}, "b": {"type": "null"}}})",
         {"{}", R"({"a":true})", R"({"b":null})", R"({"a":false,"b":null})"},
         {R"({,"b":null})", R"({"b":null,"a":true})", R"({"a":true,})"});
  Expect(R"({"type": "object", "additionalProperties": {"type": "integer"}})",
         {"{}", R"({"x":1,"y":-2})"}, {R"({"x":"1"})"});
}

TEST_F(JsonSchemaTest, ScalarsEnumsAndFormats) {
  Expect(R"({"enum": ["a", 1, null, {"k": [1, 2]}]})", {R"("a")", "1", "null", R"({"k":[1,2]})"},
         {"2", R"("b")", R"({"k":[2,1]})"});
  Expect(R"({"const": "x\"y"})", {R"("x\"y")"}, {R"("xy")"});
  Expect(R"({"type": ["string", "null"], "pattern": "^[a-z]+\"?$"})",
         {R"("abc\"")", R"("abc")", "null"}, {R"("ABC")", R"("")", R"("ab"c")"});
  Expect(R"({"type": "string", "pattern": "b"})", {R"("abc")", R"("b")"}, {R"("ac")"});
  Expect(R"({"type": "string", "format": "date"})", {R"("2024-02-28")"},
         {R"("2024-13-01")", R"("2024-04-31")"});
  Expect(R"({"type": "number"})", {"0", "-1.5e3", "12.25"}, {"01", "1.", ".5", "-"});
  Expect(R"({"type": "number", "exclusiveMinimum": 0, "maximum": 3.5})", {"1", "3"}, {"0", "4"});
  Expect(R"({"type": "string", "minLength": 2, "maxLength": 3})",
         {R"("ab")", R"("a\nb")", R"("éé")"}, {R"("a")", R"("abcd")", R"("\ud800x")"});
  Expect("{}", {"1", R"({"a":[true,{"b":null}]})", R"("x")"}, {"", "[1,]"});
}

TEST_F(JsonSchemaTest, ArraysRefsAndAlternatives) {
  Expect(R"({"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 2})",
         {"[true]", "[true, false]"}, {"[]", "[true,true,true]", "[1]"});
  Expect(R"({"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}]})",
         {R"([1,"a"])"}, {"[1]", R"(["a",1])"});
  const std::string tree = R"({"$defs": {"node": {"type": "object", "properties": {
      "v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
      "required": ["v"]}}, "$ref": "#/$defs/node"})";
  Expect(tree, {R"({"v":1,"kids":[{"v":2},{"v":3,"kids":[]}]})"}, {R"({"v":1,"kids":[{}]})"});
  Expect(R"({"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 1}]})", {"5", R"("x")"},
         {R"("xy")", "true"});
  Expect(
      R"({"oneOf": [{"type": "object", "properties": {"kind": {"const": "a"}, "x": {"type": "integer"}},
             "required": ["kind"]}, {"type": "object", "properties": {"kind": {"const": "b"}},
             "required": ["kind"]}]})",
      {R"({"kind":"a","x":1})", R"({"kind":"b"})"}, {R"({"kind":"c"})"});
  Expect(R"({"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}},
             {"required": ["a"]}]})",
         {R"({"a":1})"}, {"{}"});
}

TEST_F(JsonSchemaTest, JsonObjectAndWhitespace) {
  ASSERT_OK_AND_ASSIGN(Grammar g, JsonObjectGrammar({.any_whitespace = true}));
  GrammarMatcher m = Matcher(std::move(g));
  EXPECT_TRUE(m.Matches("{}"));
  EXPECT_TRUE(m.Matches(R"({"a": [1, {"b": null}], "c": "x"})"));
  EXPECT_FALSE(m.Matches("[]"));
  EXPECT_FALSE(m.Matches(R"({"a":})"));
  EXPECT_TRUE(m.Matches("{" + std::string(20, ' ') + "}"));
  EXPECT_FALSE(m.Matches("{" + std::string(21, ' ') + "}"));
  EXPECT_TRUE(m.Matches("{\"a\"" + std::string(20, '\n') + ":[1" + std::string(20, ' ') + "]}"));
  EXPECT_FALSE(m.Matches("{\"a\":[1" + std::string(21, ' ') + "]}"));
  GrammarMatcher list = Compile(R"({"type": "array", "items": {"type": "integer"}})");
  EXPECT_TRUE(list.Matches("[" + std::string(20, '\t') + "]"));
  EXPECT_FALSE(list.Matches("[" + std::string(21, '\t') + "]"));
  EXPECT_FALSE(list.Matches("[ 1" + std::string(21, '\t') + "]"));
}

// Compact JSON, the default: OpenAI's separators ", " and ": " and no other whitespace, so an
// unsure model cannot spend its tokens on blanks.
TEST_F(JsonSchemaTest, CompactByDefault) {
  ASSERT_OK_AND_ASSIGN(Grammar g, JsonObjectGrammar());
  GrammarMatcher m = Matcher(std::move(g));
  EXPECT_TRUE(m.Matches("{}"));
  EXPECT_TRUE(m.Matches(R"({"a": [1, {"b": null}], "c": "x y"})"));
  for (const char* spaced : {" {}", "{} ", "{ }", R"({"a":1})", R"({"a" : 1})", R"({"a":  1})",
                             R"({"a": [1,2]})", R"({"a": [ 1])", "{\"a\":\n1}"}) {
    EXPECT_FALSE(m.Matches(spaced)) << spaced;
  }
  GrammarMatcher schema =
      Compile(R"({"type": "object", "properties": {"k": {"enum": [{"x": [1, 2]}]}},
                  "required": ["k"]})",
              /*any_whitespace=*/false);
  EXPECT_TRUE(schema.Matches(R"({"k": {"x": [1, 2]}})"));
  EXPECT_FALSE(schema.Matches(R"({"k": {"x":[1,2]}})"));
}

TEST_F(JsonSchemaTest, RefusesWhatItCannotKeep) {
  EXPECT_THAT(Refusal(R"({"not": {"type": "string"}})"), ::testing::HasSubstr("'not' at #"));
  EXPECT_THAT(Refusal(R"({"properties": {"a": {"type": "number", "multipleOf": 2}}})"),
              ::testing::HasSubstr("'multipleOf' at #/properties/a"));
  EXPECT_THAT(Refusal(R"({"type": "array", "uniqueItems": true})"),
              ::testing::HasSubstr("uniqueItems"));
  EXPECT_THAT(Refusal(R"({"oneOf": [{"type": "integer"}, {"minimum": 2}]})"),
              ::testing::HasSubstr("oneOf"));
  EXPECT_THAT(Refusal(R"({"type": "string", "format": "hostname"})"),
              ::testing::HasSubstr("format: hostname"));
  EXPECT_THAT(Refusal(R"({"$ref": "#/$defs/missing"})"), ::testing::HasSubstr("does not resolve"));
  EXPECT_THAT(Refusal(R"({"$ref": "other.json"})"), ::testing::HasSubstr("another document"));
  EXPECT_THAT(Refusal("{"), ::testing::HasSubstr("not valid JSON"));
  EXPECT_THAT(Refusal(R"({"type": "integer", "minimum": 5, "maximum": 4})"),
              ::testing::HasSubstr("no integer"));
  EXPECT_THAT(Refusal(R"({"type": "strin"})"), ::testing::HasSubstr("unknown type"));
}

// Schemas of the wrong shapes get errors, never an exception or a crash.
TEST_F(JsonSchemaTest, HostileSchemasAreErrors) {
  for (const char* schema : {
           R"({"items": [1], "$ref": "#/items/0000000000000000000000001"})",
           R"({"$defs": {"a": [true]}, "$ref": "#/$defs/a/99999999999"})",
           R"({"allOf": [{"$ref": 5}]})",
           R"({"allOf": [3]})",
           R"({"anyOf": [{"$ref": []}], "type": "integer"})",
           R"({"oneOf": [{"$ref": {}}, {"type": "string"}]})",
           R"({"type": "array", "prefixItems": {"a": 1}})",
           R"({"type": "object", "properties": 4})",
           R"({"type": "object", "required": [1]})",
           R"({"type": "string", "maxLength": 1e400})",
           R"({"type": "integer", "minimum": -1e400})",
           R"({"enum": 3})",
           R"({"type": "string", "pattern": 7})",
           R"({"patternProperties": {"(": {}}, "properties": {"a": {}}})",
       }) {
    const absl::StatusOr<Grammar> g = CompileJsonSchema(schema);
    if (g.ok()) continue;  // some are valid schemas: then any grammar will do
    EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument) << schema << g.status();
  }
}

}  // namespace
}  // namespace kvserve::structured
