// Tool calls: the splitter gives the same content and calls however the output is cut into
// pieces, for each format; what does not parse stays content; the schema of tool_choice
// "required" keeps each tool's $refs pointing into its own parameters.
#include "frontend/output/tool_calls.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/structured/grammar.h"
#include "common/structured/json_schema.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace kvserve::frontend {
namespace {

struct Split {
  std::string content;
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments
};

// The parts of `text` fed in pieces of `step` bytes.
Split SplitAll(ToolOutput format, const std::string& text, size_t step, std::string name = "") {
  ToolCallSplitter s(format, std::move(name));
  Split all;
  auto add = [&](const ToolCallSplitter::Parts& p) {
    all.content += p.content;
    for (const ParsedToolCall& c : p.calls) {
      EXPECT_TRUE(absl::StartsWith(c.id, "call_")) << c.id;
      EXPECT_EQ(c.id.size(), 29u);
      all.calls.emplace_back(c.name, c.arguments);
    }
  };
  for (size_t i = 0; i < text.size(); i += step) add(s.Append(text.substr(i, step)));
  add(s.Finish());
  return all;
}

struct Case {
  ToolOutput format;
  std::string text;
  std::string content;
  std::vector<std::pair<std::string, std::string>> calls;
};

TEST(ToolCallSplitterTest, SameInAnyPieces) {
  const std::vector<Case> cases = {
      {ToolOutput::kHermes,
       "Let me check.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\":1}}\n"
       "</tool_call>\n<tool_call>\n{\"name\": \"g\", \"arguments\": {}}\n"
       "</tool_call>",
       "Let me check.\n",
       {{"f", "{\"a\": 1}"}, {"g", "{}"}}},
      {ToolOutput::kHermes, "no calls, just <tool text", "no calls, just <tool text", {}},
      // Unclosed at the end (cut off or stopped): still a call when its JSON is whole.
      {ToolOutput::kHermes,
       "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": [1, 2]}}",
       "",
       {{"f", "{\"x\": [1, 2]}"}}},
      // A block that does not parse is content, as it came.
      {ToolOutput::kHermes,
       "<tool_call>\n{\"name\": 3}\n</tool_call> tail",
       "<tool_call>\n{\"name\": 3}\n</tool_call> tail",
       {}},
      // Text after a call: dropped when blank, content otherwise.
      {ToolOutput::kHermes,
       "<tool_call>{\"name\":\"f\",\"arguments\":{}}</tool_call>\nDone.",
       "\nDone.",
       {{"f", "{}"}}},
      {ToolOutput::kLlama3Json,
       "{\"name\": \"f\", \"parameters\": {\"q\": \"é\"}}; "
       "{\"name\": \"g\", \"arguments\": {}}",
       "",
       {{"f", "{\"q\": \"é\"}"}, {"g", "{}"}}},
      {ToolOutput::kLlama3Json,
       "<|python_tag|>{\"name\": \"f\", \"parameters\": {}}",
       "",
       {{"f", "{}"}}},
      {ToolOutput::kLlama3Json, "Plain answer {not a call}", "Plain answer {not a call}", {}},
      {ToolOutput::kLlama3Json,
       "{\"name\": \"f\", \"parameters\": {\"a\": ",
       "{\"name\": \"f\", \"parameters\": {\"a\": ",
       {}},
      {ToolOutput::kRequiredArray,
       "[{\"name\": \"f\", \"parameters\": {\"s\": \"}{\"}}, {\"name\": \"g\", \"parameters\": "
       "{}}]",
       "",
       {{"f", "{\"s\": \"}{\"}"}, {"g", "{}"}}},
      {ToolOutput::kRequiredArray, "[{\"name\": \"f\", \"param", "[{\"name\": \"f\", \"param", {}},
  };
  for (const Case& c : cases) {
    for (size_t step : {1, 2, 5, 1000}) {
      Split got = SplitAll(c.format, c.text, step);
      EXPECT_EQ(got.content, c.content) << c.text << " step " << step;
      EXPECT_EQ(got.calls, c.calls) << c.text << " step " << step;
    }
  }
}

TEST(ToolCallSplitterTest, CallsOfUnknownToolsAreContent) {
  const std::string hermes = "<tool_call>{\"name\": \"nope\", \"arguments\": {}}</tool_call>";
  ToolCallSplitter h(ToolOutput::kHermes, "", {"f"});
  ToolCallSplitter::Parts p = h.Append(hermes);
  ToolCallSplitter::Parts rest = h.Finish();
  EXPECT_TRUE(p.calls.empty() && rest.calls.empty());
  EXPECT_EQ(p.content + rest.content, hermes);
  // A JSON answer is not a call: its name is no tool's, or it has no arguments.
  for (const std::string text : {"{\"name\": \"Bob\", \"parameters\": {}}", "{\"name\": \"f\"}"}) {
    ToolCallSplitter l(ToolOutput::kLlama3Json, "", {"f"});
    l.Append(text);
    rest = l.Finish();
    EXPECT_TRUE(rest.calls.empty()) << text;
    EXPECT_EQ(rest.content, text);
  }
}

TEST(ToolCallSplitterTest, NamedFunctionTakesTheArguments) {
  Split got = SplitAll(ToolOutput::kNamedArguments, "{\"city\":\"Paris\"}", 3, "weather");
  ASSERT_EQ(got.calls.size(), 1u);
  EXPECT_EQ(got.calls[0],
            std::make_pair(std::string("weather"), std::string("{\"city\": \"Paris\"}")));
  EXPECT_EQ(got.content, "");
  got = SplitAll(ToolOutput::kNamedArguments, "{\"city\":", 3, "weather");  // cut off
  EXPECT_TRUE(got.calls.empty());
  EXPECT_EQ(got.content, "{\"city\":");
}

// Numbers past a double's range are JSON (a schema's unbounded integer lets a model run on):
// the call parses and its arguments carry the numbers as written (vLLM's required-tools test
// saw such calls come back as content). A string that looks like a number stays a string.
TEST(ToolCallSplitterTest, NumbersPastADoublesRangeStayAsWritten) {
  const std::string huge(400, '9');
  const std::string text =
      absl::StrCat("[{\"name\": \"f\", \"parameters\": {\"days\": -", huge,
                   ", \"x\": [1e999, 2.5E+400, 1e-999], \"s\": \"1e999 \\\" 7e999\"}}]");
  Split got = SplitAll(ToolOutput::kRequiredArray, text, 7);
  ASSERT_EQ(got.calls.size(), 1u) << got.content;
  EXPECT_EQ(got.calls[0].second,
            absl::StrCat("{\"days\": -", huge,
                         ", \"x\": [1e999, 2.5E+400, 0.0], \"s\": \"1e999 \\\" 7e999\"}"));
  EXPECT_EQ(got.content, "");
  got = SplitAll(ToolOutput::kNamedArguments, absl::StrCat("{\"n\": ", huge, "}"), 5, "g");
  ASSERT_EQ(got.calls.size(), 1u);
  EXPECT_EQ(got.calls[0].second, absl::StrCat("{\"n\": ", huge, "}"));
  // Not JSON for another reason: still content.
  got = SplitAll(ToolOutput::kNamedArguments, absl::StrCat("{\"n\": ", huge, ",}"), 5, "g");
  EXPECT_TRUE(got.calls.empty());
}

TEST(ToolCallSplitterTest, HermesStreamsContentBeforeTheCall) {
  ToolCallSplitter s(ToolOutput::kHermes, "");
  EXPECT_EQ(s.Append("Sure. <tool").content, "Sure. ");  // "<tool" may open a call
  ToolCallSplitter::Parts p = s.Append("_call>{\"name\": \"f\"}</tool_call>");
  EXPECT_EQ(p.content, "");
  ASSERT_EQ(p.calls.size(), 1u);  // sent as soon as it closes
  EXPECT_EQ(p.calls[0].arguments, "{}");
}

TEST(ToolChoiceSchemaTest, RequiredMovesRefsAndBoundsParallelCalls) {
  ToolRequest r;
  r.tools = {{"a", "{}",
              R"({"type":"object","properties":{"x":{"$ref":"#/$defs/X"},)"
              R"("const":{"const":{"$ref":"#/keep"}}},"$defs":{"X":{"type":"integer"}}})"},
             {"b", "{}", ""}};
  r.choice = ToolChoice::kRequired;
  r.parallel = false;
  ASSERT_OK_AND_ASSIGN(std::string schema, ToolChoiceSchema(r));
  EXPECT_TRUE(absl::StrContains(schema, "\"#/items/anyOf/0/properties/parameters/$defs/X\""));
  EXPECT_TRUE(absl::StrContains(schema, "\"#/keep\""));  // data, not a reference
  EXPECT_TRUE(absl::StrContains(schema, "\"maxItems\":1"));
  ASSERT_OK_AND_ASSIGN(structured::Grammar g, structured::CompileJsonSchema(schema));
  r.choice = ToolChoice::kNamed;
  r.name = "b";
  ASSERT_OK_AND_ASSIGN(std::string named, ToolChoiceSchema(r));
  EXPECT_EQ(named, R"({"type":"object","properties":{},"additionalProperties":false})");
  r.name = "c";
  EXPECT_THAT(ToolChoiceSchema(r), ::kvserve::testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                                                ::testing::HasSubstr("'c'")));
}

// A function's arguments are always an object: `{}` is a function of no parameters, a schema
// without a type is held to "object" (through allOf when it is a bare $ref). Before, `{}` let
// the model write any JSON value there (-609, a string, an array).
TEST(ToolChoiceSchemaTest, ArgumentsAreAlwaysAnObject) {
  auto matches = [](const ToolRequest& r, std::string_view text) {
    absl::StatusOr<std::string> schema = ToolChoiceSchema(r);
    EXPECT_TRUE(schema.ok()) << schema.status();
    absl::StatusOr<structured::Grammar> g = structured::CompileJsonSchema(*schema);
    EXPECT_TRUE(g.ok()) << g.status() << " in " << *schema;
    structured::GrammarMatcher m(std::make_shared<const structured::Grammar>(*std::move(g)));
    return m.Matches(text);
  };
  ToolRequest r;
  r.choice = ToolChoice::kRequired;
  r.tools = {{"f", "{}", "{}"}};
  EXPECT_TRUE(matches(r, R"([{"name": "f", "parameters": {}}])"));
  for (const char* bad : {"-609", "\"x\"", "[1]", "null", R"({"a": 1})"}) {
    EXPECT_FALSE(matches(r, absl::StrCat(R"([{"name": "f", "parameters": )", bad, "}]"))) << bad;
  }
  r.choice = ToolChoice::kNamed;
  r.name = "f";
  EXPECT_TRUE(matches(r, "{}"));
  EXPECT_FALSE(matches(r, "-609"));
  r.tools = {{"f", "{}", R"({"properties": {"a": {"type": "integer"}}})"}};
  EXPECT_TRUE(matches(r, R"({"a": 1})"));
  EXPECT_FALSE(matches(r, "7"));
  EXPECT_FALSE(matches(r, R"("a")"));
  r.tools = {{"f", "{}", R"({"$ref": "#/$defs/A", "$defs": {"A": {"properties": {"a": {}}}}})"}};
  EXPECT_TRUE(matches(r, R"({"a": [true]})"));
  EXPECT_FALSE(matches(r, "[1]"));
  r.choice = ToolChoice::kRequired;
  EXPECT_TRUE(matches(r, R"([{"name": "f", "parameters": {"a": 2}}])"));
  EXPECT_FALSE(matches(r, R"([{"name": "f", "parameters": 2}])"));
}

TEST(ToolChoiceSchemaTest, ParserNames) {
  ASSERT_OK_AND_ASSIGN(ToolOutput hermes, ToolParserFor("hermes"));
  EXPECT_EQ(hermes, ToolOutput::kHermes);
  ASSERT_OK_AND_ASSIGN(ToolOutput llama, ToolParserFor("llama3_json"));
  EXPECT_EQ(llama, ToolOutput::kLlama3Json);
  EXPECT_THAT(ToolParserFor("mistral"),
              ::kvserve::testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                           ::testing::HasSubstr("'mistral'")));
}

}  // namespace
}  // namespace kvserve::frontend
