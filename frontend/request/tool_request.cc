#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/string_util.h"
#include "frontend/request/request_fields.h"
#include "nlohmann/json.hpp"

namespace kvserve::frontend::request_fields {

namespace {

bool IsToolName(std::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(c) && c != '_' && c != '-') return false;
  }
  return true;
}

// One entry of `tools`: {"type": "function", "function": {"name", "description",
// "parameters"}}.
absl::StatusOr<ToolSpec> ParseTool(element t, const std::string& param) {
  object to, fo;
  if (t.get_object().get(to) != simdjson::SUCCESS) return Bad(param, "must be an object");
  ASSIGN_OR_RETURN(std::string type, String(to, "type"));
  if (type != "function") return Bad(param + ".type", "must be \"function\"");
  if (auto f = Field(to, "function"); !f || f->get_object().get(fo) != simdjson::SUCCESS) {
    return Bad(param + ".function", "must be an object with a \"name\"");
  }
  ToolSpec tool;
  ASSIGN_OR_RETURN(tool.name, String(fo, "name"));
  if (!IsToolName(tool.name)) {
    return Bad(param + ".function.name", "must be 1 to 64 letters, digits, underscores or dashes");
  }
  if (auto p = Field(fo, "parameters")) {
    if (!p->is_object()) return Bad(param + ".function.parameters", "must be a JSON schema object");
    // A function's arguments are a JSON object (OpenAI refuses any other type; no type is
    // held to "object" when the call is constrained, tool_calls.h).
    object po;
    std::string_view type;
    auto given = p->get_object().get(po) == simdjson::SUCCESS ? Field(po, "type") : std::nullopt;
    if (given && (given->get_string().get(type) != simdjson::SUCCESS || type != "object")) {
      return Bad(param + ".function.parameters.type",
                 absl::StrCat("must be \"object\" (a function's arguments are a JSON object), not ",
                              Sv(simdjson::minify(*given).substr(0, 64))));
    }
    tool.parameters = simdjson::minify(*p);
  }
  tool.definition = simdjson::minify(t);
  return tool;
}

// tool_choice: "none" | "auto" | "required" | {"type": "function", "function": {"name"}}.
absl::Status ParseToolChoice(object o, ToolRequest* t) {
  auto e = Field(o, "tool_choice");
  t->choice = t->tools.empty() ? ToolChoice::kNone : ToolChoice::kAuto;
  if (!e) return absl::OkStatus();
  std::string_view text;
  object co, fo;
  if (e->get_string().get(text) == simdjson::SUCCESS) {
    if (text == "none")
      t->choice = ToolChoice::kNone;
    else if (text == "required")
      t->choice = ToolChoice::kRequired;
    else if (text == "auto")
      t->choice = ToolChoice::kAuto;
    else
      return Bad("tool_choice", "must be none, auto, required or a function");
  } else if (e->get_object().get(co) == simdjson::SUCCESS &&
             co["function"].get(fo) == simdjson::SUCCESS &&
             fo["name"].get(text) == simdjson::SUCCESS) {
    t->choice = ToolChoice::kNamed;
    t->name = std::string(text);
    const bool known = std::any_of(t->tools.begin(), t->tools.end(),
                                   [&](const ToolSpec& s) { return s.name == t->name; });
    if (!known) {
      return Bad("tool_choice", absl::StrCat("names '", Sv(text.substr(0, 64)),
                                             "', which is not one of the tools"));
    }
  } else {
    return Bad("tool_choice",
               "must be none, auto, required or {\"type\": \"function\", \"function\": "
               "{\"name\": ...}}");
  }
  if (t->tools.empty() && t->choice != ToolChoice::kNone) {
    return Bad("tool_choice", "needs tools: give tools, or leave tool_choice unset or \"none\"");
  }
  return absl::OkStatus();
}

// The constraint of tool_choice "required" or a named function: each tool's parameters are
// compiled alone first, so that a bad one is a 400 naming it.
absl::Status ToolConstraint(const RequestLimits& limits, ParsedRequest* r) {
  const ToolRequest& t = r->tool_use;
  if (t.choice != ToolChoice::kRequired && t.choice != ToolChoice::kNamed) return absl::OkStatus();
  if (r->constraint) {
    return Bad("tool_choice",
               "\"required\" and a named function constrain the output themselves; leave "
               "response_format and structured outputs unset");
  }
  for (size_t i = 0; i < t.tools.size(); ++i) {
    if (t.tools[i].parameters.empty() ||
        (t.choice == ToolChoice::kNamed && t.tools[i].name != t.name)) {
      continue;
    }
    structured::ConstraintSpec one{.kind = structured::ConstraintSpec::Kind::kJsonSchema,
                                   .json_schema = t.tools[i].parameters};
    RETURN_IF_ERROR(CheckCompiles(one, absl::StrCat("tools[", i, "].function.parameters")));
  }
  structured::ConstraintSpec spec{.kind = structured::ConstraintSpec::Kind::kJsonSchema,
                                  .any_whitespace = limits.json_any_whitespace};
  ASSIGN_OR_RETURN(spec.json_schema, ToolChoiceSchema(t));
  if (spec.json_schema.size() > static_cast<size_t>(limits.max_constraint_bytes)) {
    return Bad("tools", absl::StrCat("the schema of tool_choice has ", spec.json_schema.size(),
                                     " bytes; the limit is ", limits.max_constraint_bytes));
  }
  RETURN_IF_ERROR(CheckCompiles(spec, "tools"));
  r->constraint = std::move(spec);
  return absl::OkStatus();
}

}  // namespace

// Chat's tools, tool_choice and parallel_tool_calls.
absl::Status ParseTools(object o, const RequestLimits& limits, ParsedRequest* r) {
  ToolRequest& t = r->tool_use;
  if (auto e = Field(o, "tools")) {
    simdjson::dom::array arr;
    if (e->get_array().get(arr) != simdjson::SUCCESS) return Bad("tools", "must be a list");
    if (arr.size() == 0) {
      return Bad("tools",
                 "must not be an empty list (as in OpenAI's API and vLLM): give a tool "
                 "or leave tools out");
    }
    if (arr.size() > static_cast<size_t>(limits.max_tools)) {
      return Bad("tools",
                 absl::StrCat("has ", arr.size(), " tools; the limit is ", limits.max_tools));
    }
    int64_t bytes = 0;
    size_t i = 0;
    for (element e : arr) {
      const std::string param = absl::StrCat("tools[", i++, "]");
      ASSIGN_OR_RETURN(ToolSpec tool, ParseTool(e, param));
      for (const ToolSpec& other : t.tools) {
        if (other.name == tool.name) return Bad(param + ".function.name", "names two tools");
      }
      bytes += static_cast<int64_t>(tool.definition.size());
      if (bytes > limits.max_prompt_bytes) return TooLong("tools", bytes, limits);
      t.tools.push_back(std::move(tool));
    }
  }
  RETURN_IF_ERROR(ParseToolChoice(o, &t));
  ASSIGN_OR_RETURN(t.parallel, Bool(o, "parallel_tool_calls", true));
  return ToolConstraint(limits, r);
}

}  // namespace kvserve::frontend::request_fields
