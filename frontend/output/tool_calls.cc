#include "frontend/output/tool_calls.h"

#include <algorithm>
#include <optional>
#include <random>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/json_text.h"
#include "common/string_util.h"
#include "frontend/output/hold_back.h"
#include "frontend/output/model_json.h"
#include "frontend/output/reasoning.h"
#include "nlohmann/json.hpp"

namespace kvserve::frontend {
namespace {

using Json = nlohmann::ordered_json;

constexpr std::string_view kCallStart = "<tool_call>";
constexpr std::string_view kCallEnd = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr int kMaxRefDepth = 256;

// Keywords whose values are data, not schemas: a "$ref" inside them is not a reference.
bool IsDataKeyword(std::string_view key) {
  return key == "const" || key == "enum" || key == "default" || key == "examples";
}

// Keywords whose values map names to schemas (so their keys are not keywords).
bool IsSchemaMap(std::string_view key) {
  return key == "properties" || key == "patternProperties" || key == "$defs" ||
         key == "definitions" || key == "dependentSchemas";
}

// Moves each local "$ref" ("#...") of schema `s` below the JSON pointer `prefix`; false past
// kMaxRefDepth levels. `names`: `s` maps names to schemas.
bool MoveRefs(Json& s, const std::string& prefix, int depth, bool names) {
  if (depth > kMaxRefDepth) return false;
  if (s.is_array()) {
    for (Json& v : s) {
      if (!MoveRefs(v, prefix, depth + 1, false)) return false;
    }
    return true;
  }
  if (!s.is_object()) return true;
  for (auto& [key, value] : s.items()) {
    if (!names && IsDataKeyword(key)) continue;
    if (!names && key == "$ref" && value.is_string()) {
      const std::string ref = value.get<std::string>();
      if (absl::StartsWith(ref, "#")) value = absl::StrCat("#", prefix, ref.substr(1));
      continue;
    }
    if (!MoveRefs(value, prefix, depth + 1, !names && IsSchemaMap(key))) return false;
  }
  return true;
}

std::string CallId() {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += kAlphabet[rng() % (sizeof(kAlphabet) - 1)];
  return id;
}

// A call from {"name": ..., `args`: {...}} (`args` "arguments" or "parameters"; either is taken,
// and one is needed, when `either`); nullopt when it is not one, or names none of `names` (when
// there are names).
std::optional<ParsedToolCall> CallFrom(const Json& j, std::string_view args, bool either,
                                       const std::vector<std::string>& names) {
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return std::nullopt;
  const std::string name = j["name"].get<std::string>();
  if (!names.empty() && std::find(names.begin(), names.end(), name) == names.end()) {
    return std::nullopt;
  }
  std::string key(args);
  if (either && !j.contains(key)) {
    key = key == "arguments" ? "parameters" : "arguments";
    if (!j.contains(key)) return std::nullopt;
  }
  const Json arguments = j.contains(key) ? j[key] : Json::object();
  if (!arguments.is_object()) return std::nullopt;
  absl::StatusOr<std::string> text = PythonJsonText(arguments.dump());
  if (!text.ok()) return std::nullopt;
  return ParsedToolCall{CallId(), name, RestoreNumbers(*std::move(text))};
}

Json ParseJson(std::string_view text) { return ParseModelJson(text); }

// Where the JSON object starting at text[begin] ('{') ends (one past its '}'), or npos.
size_t ObjectEnd(std::string_view text, size_t begin) {
  int depth = 0;
  JsonStringScan scan;
  for (size_t i = begin; i < text.size(); ++i) {
    const char c = text[i];
    if (scan.InString(c)) continue;
    if (c == '{' || c == '[') {
      ++depth;
    } else if ((c == '}' || c == ']') && --depth == 0) {
      return i + 1;
    }
  }
  return std::string_view::npos;
}

// Llama 3.1's format: objects joined by ';' (after an optional python tag).
std::vector<ParsedToolCall> Llama3Calls(std::string_view text,
                                        const std::vector<std::string>& names) {
  text = StdSv(absl::StripAsciiWhitespace(Sv(text)));
  if (absl::StartsWith(Sv(text), Sv(kPythonTag))) text.remove_prefix(kPythonTag.size());
  std::vector<ParsedToolCall> calls;
  size_t i = 0;
  while (true) {
    while (i < text.size() && (absl::ascii_isspace(text[i]) || text[i] == ';')) ++i;
    if (i == text.size()) return calls;
    if (text[i] != '{') return {};
    const size_t end = ObjectEnd(text, i);
    if (end == std::string_view::npos) return {};
    std::optional<ParsedToolCall> call =
        CallFrom(ParseJson(text.substr(i, end - i)), "parameters", /*either=*/true, names);
    if (!call) return {};
    calls.push_back(*std::move(call));
    i = end;
  }
}

bool IsBlank(std::string_view s) { return absl::StripAsciiWhitespace(Sv(s)).empty(); }

}  // namespace

absl::StatusOr<ToolOutput> ToolParserFor(std::string_view parser) {
  if (parser == "hermes") return ToolOutput::kHermes;
  if (parser == "llama3_json") return ToolOutput::kLlama3Json;
  return absl::InvalidArgumentError(absl::StrCat("--tool-call-parser: unknown parser '", Sv(parser),
                                                 "' (hermes and llama3_json are served)"));
}

namespace {

// The schema of a tool's arguments, which are always a JSON object. No parameters, or `{}`, is
// a function that takes none (OpenAI's and vLLM's reading): its arguments are {}. A schema
// without a type is held to "object" (one with a top-level $ref through allOf, since $ref
// takes no sibling keywords); a type other than "object" was refused when the request was
// parsed.
Json ArgumentsSchema(const ToolSpec& tool) {
  Json s = tool.parameters.empty() ? Json::object() : ParseJson(tool.parameters);
  if (s.empty()) {
    return {{"type", "object"}, {"properties", Json::object()}, {"additionalProperties", false}};
  }
  if (s.contains("type")) return s;
  if (!s.contains("$ref")) {
    s["type"] = "object";
    return s;
  }
  Json out = {{"type", "object"}};
  for (const char* key : {"$defs", "definitions"}) {
    if (s.contains(key)) {
      out[key] = std::move(s[key]);
      s.erase(key);
    }
  }
  out["allOf"] = Json::array({std::move(s)});
  return out;
}

}  // namespace

absl::StatusOr<std::string> ToolChoiceSchema(const ToolRequest& request) {
  auto parameters = ArgumentsSchema;
  if (request.choice == ToolChoice::kNamed) {
    for (const ToolSpec& tool : request.tools) {
      if (tool.name == request.name) return parameters(tool).dump();
    }
    return absl::InvalidArgumentError(
        absl::StrCat("tool_choice: no tool is named '", request.name, "'"));
  }
  if (request.choice != ToolChoice::kRequired) return std::string();
  Json any = Json::array();
  for (size_t i = 0; i < request.tools.size(); ++i) {
    Json params = parameters(request.tools[i]);
    if (!MoveRefs(params, absl::StrCat("/items/anyOf/", i, "/properties/parameters"), 0, false)) {
      return absl::InvalidArgumentError(absl::StrCat("tools[", i,
                                                     "].function.parameters: nests "
                                                     "deeper than ",
                                                     kMaxRefDepth, " levels"));
    }
    any.push_back(
        {{"type", "object"},
         {"properties",
          {{"name", {{"const", request.tools[i].name}}}, {"parameters", std::move(params)}}},
         {"required", {"name", "parameters"}},
         {"additionalProperties", false}});
  }
  Json schema = {{"type", "array"}, {"minItems", 1}};
  if (!request.parallel) schema["maxItems"] = 1;
  schema["items"] = {{"anyOf", std::move(any)}};
  return schema.dump();
}

ToolCallSplitter::ToolCallSplitter(ToolOutput format, std::string name,
                                   std::vector<std::string> names)
    : format_(format), name_(std::move(name)), names_(std::move(names)) {
  if (format_ == ToolOutput::kRequiredArray || format_ == ToolOutput::kNamedArguments) {
    state_ = State::kWhole;
  } else if (format_ == ToolOutput::kHermes) {
    state_ = State::kContent;
  }
}

ToolCallSplitter::Parts ToolCallSplitter::Append(std::string_view text) {
  pending_ += text;
  Parts out;
  Drain(out, false);
  return out;
}

ToolCallSplitter::Parts ToolCallSplitter::Finish() {
  Parts out;
  Drain(out, true);
  return out;
}

void ToolCallSplitter::Drain(Parts& out, bool final) {
  if (state_ == State::kStart) {  // llama3_json: calls when the output opens with one
    std::string_view head = StdSv(absl::StripLeadingAsciiWhitespace(Sv(pending_)));
    if (absl::StartsWith(Sv(head), "{") || absl::StartsWith(Sv(head), Sv(kPythonTag))) {
      state_ = State::kWhole;
    } else if (!final && (head.empty() || absl::StartsWith(Sv(kPythonTag), Sv(head)))) {
      return;
    } else {
      state_ = State::kContent;
    }
  }
  if (state_ == State::kWhole) {
    if (final) ParseWhole(out);
    return;
  }
  if (format_ == ToolOutput::kHermes) return DrainHermes(out, final);
  out.content += pending_;
  pending_.clear();
}

void ToolCallSplitter::DrainHermes(Parts& out, bool final) {
  // Text outside calls: content; after a call, kept back until it shows it is not blank.
  auto text = [&](std::string_view s) { (called_ ? between_ : out.content) += s; };
  auto flush_between = [&] {
    if (!IsBlank(between_)) out.content += between_;
    between_.clear();
  };
  while (true) {
    if (state_ == State::kCall) {
      const size_t end = pending_.find(kCallEnd);
      if (end == std::string::npos && !final) return;
      const std::string body = pending_.substr(0, end);
      std::optional<ParsedToolCall> call =
          CallFrom(ParseJson(StdSv(absl::StripAsciiWhitespace(body))), "arguments",
                   /*either=*/false, names_);
      if (call) {
        out.calls.push_back(*std::move(call));
        called_ = true;
      } else {  // not a call: the text as it came
        text(absl::StrCat(Sv(kCallStart), body, end == std::string::npos ? "" : Sv(kCallEnd)));
      }
      pending_.erase(0, end == std::string::npos ? pending_.size() : end + kCallEnd.size());
      state_ = State::kContent;
      if (end == std::string::npos) break;
      continue;
    }
    const size_t start = pending_.find(kCallStart);
    if (start == std::string::npos) {
      const size_t keep = final ? 0 : PartialMatchLength(pending_, kCallStart);
      text(std::string_view(pending_).substr(0, pending_.size() - keep));
      pending_.erase(0, pending_.size() - keep);
      break;
    }
    text(std::string_view(pending_).substr(0, start));
    flush_between();
    pending_.erase(0, start + kCallStart.size());
    state_ = State::kCall;
  }
  if (final) flush_between();
}

void ToolCallSplitter::ParseWhole(Parts& out) {
  if (format_ == ToolOutput::kLlama3Json) {
    out.calls = Llama3Calls(pending_, names_);
  } else if (format_ == ToolOutput::kNamedArguments) {
    Json wrapped = {{"name", name_}, {"arguments", ParseJson(pending_)}};
    if (std::optional<ParsedToolCall> call = CallFrom(wrapped, "arguments", false, {})) {
      out.calls.push_back(*std::move(call));
    }
  } else if (Json list = ParseJson(pending_); list.is_array()) {
    for (const Json& entry : list) {
      std::optional<ParsedToolCall> call = CallFrom(entry, "parameters", /*either=*/false, {});
      if (!call) {
        out.calls.clear();
        break;
      }
      out.calls.push_back(*std::move(call));
    }
  }
  if (out.calls.empty()) out.content = std::move(pending_);
  pending_.clear();
}

}  // namespace kvserve::frontend
