#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "common/string_util.h"
#include "frontend/request/request_fields.h"
#include "nlohmann/json.hpp"

namespace kvserve::frontend::request_fields {

namespace {

// A choice list at `e` into `spec`.
absl::Status ChoiceList(element e, const std::string& param, const RequestLimits& limits,
                        structured::ConstraintSpec* spec) {
  simdjson::dom::array arr;
  if (e.get_array().get(arr) != simdjson::SUCCESS || arr.size() == 0) {
    return Bad(param, "must be a non-empty list of strings");
  }
  if (arr.size() > static_cast<size_t>(limits.max_choices)) {
    return Bad(param,
               absl::StrCat("has ", arr.size(), " choices; the limit is ", limits.max_choices));
  }
  spec->kind = structured::ConstraintSpec::Kind::kChoice;
  int64_t bytes = 0;
  for (element c : arr) {
    std::string_view text;
    if (c.get_string().get(text) != simdjson::SUCCESS) return Bad(param, "must hold strings");
    bytes += static_cast<int64_t>(text.size());
    spec->choices.emplace_back(text);
  }
  if (bytes > limits.max_constraint_bytes) {
    return Bad(param, absl::StrCat("has ", bytes, " bytes of choices; the limit is ",
                                   limits.max_constraint_bytes));
  }
  return absl::OkStatus();
}

// A JSON schema at `e` (an object, or a string holding one) into `spec`.
absl::Status SchemaText(element e, const std::string& param, const RequestLimits& limits,
                        structured::ConstraintSpec* spec) {
  std::string_view text;
  std::string schema;
  if (e.get_string().get(text) == simdjson::SUCCESS) {
    schema = std::string(text);
  } else if (e.is_object() || e.is_bool()) {
    schema = simdjson::minify(e);
  } else {
    return Bad(param, "must be a JSON schema (an object, or a string holding one)");
  }
  if (schema.size() > static_cast<size_t>(limits.max_constraint_bytes)) {
    return Bad(param, absl::StrCat("has ", schema.size(), " bytes; the limit is ",
                                   limits.max_constraint_bytes));
  }
  spec->kind = structured::ConstraintSpec::Kind::kJsonSchema;
  spec->json_schema = std::move(schema);
  return absl::OkStatus();
}

// OpenAI's response_format: text (no constraint), json_object, or json_schema {schema, strict}.
absl::Status ResponseFormat(element e, std::vector<std::pair<std::string, element>>* given) {
  object format;
  std::string_view type;
  if (e.get_object().get(format) != simdjson::SUCCESS ||
      format["type"].get(type) != simdjson::SUCCESS) {
    return Bad("response_format", "must be an object with a string \"type\"");
  }
  if (type == "text") return absl::OkStatus();
  if (type == "json_object") {
    given->emplace_back("response_format", e);
    return absl::OkStatus();
  }
  if (type != "json_schema") {
    return Bad("response_format.type", "must be \"text\", \"json_object\" or \"json_schema\"");
  }
  object js;
  if (auto j = Field(format, "json_schema"); !j || j->get_object().get(js) != simdjson::SUCCESS) {
    return Bad("response_format.json_schema", "must be an object with a \"schema\"");
  }
  auto schema = Field(js, "schema");
  if (!schema) return Bad("response_format.json_schema.schema", "is required");
  // strict (true or false) is accepted: the output always keeps to the schema.
  if (auto strict = Field(js, "strict"); strict && !strict->is_bool() && !strict->is_null()) {
    return Bad("response_format.json_schema.strict", "must be a boolean");
  }
  given->emplace_back("response_format.json_schema.schema", *schema);
  return absl::OkStatus();
}

// A regex or a GBNF grammar at `e` into `spec`, as `kind`.
absl::Status ConstraintText(element e, const std::string& param, const RequestLimits& limits,
                            structured::ConstraintSpec::Kind kind,
                            structured::ConstraintSpec* spec) {
  std::string_view text;
  if (e.get_string().get(text) != simdjson::SUCCESS) return Bad(param, "must be a string");
  if (text.size() > static_cast<size_t>(limits.max_constraint_bytes)) {
    return Bad(param, absl::StrCat("has ", text.size(), " bytes; the limit is ",
                                   limits.max_constraint_bytes));
  }
  spec->kind = kind;
  (kind == structured::ConstraintSpec::Kind::kRegex ? spec->regex : spec->grammar) = text;
  return absl::OkStatus();
}

}  // namespace

// Whether `spec` compiles (a 400 naming `param` if not). The sources that compiled lately are
// remembered (at most 256, forgotten all at once when full), so that requests sending the same
// schema do not each pay its compile (tens of ms) on the handler threads.
absl::Status CheckCompiles(const structured::ConstraintSpec& spec, const std::string& param) {
  static absl::Mutex mu(absl::kConstInit);
  static auto* compiled ABSL_GUARDED_BY(mu) = new absl::flat_hash_set<std::string>();
  const std::string key = spec.Key();
  {
    absl::MutexLock lock(&mu);
    if (compiled->contains(key)) return absl::OkStatus();
  }
  if (auto grammar = structured::CompileConstraint(spec); !grammar.ok()) {
    // (A pattern past the automaton's limits is the request's fault too: a 400.)
    return absl::InvalidArgumentError(absl::StrCat(param, ": ", grammar.status().message()));
  }
  absl::MutexLock lock(&mu);
  if (compiled->size() >= 256) compiled->clear();
  compiled->insert(key);
  return absl::OkStatus();
}

namespace {

// structured_outputs' keys besides the constraint (vLLM's StructuredOutputsParams): every key
// is known or refused by name. disable_any_whitespace picks compact JSON (true) or any
// whitespace (false) over the server's default; disable_fallback asks nothing of kvserve (it
// has one engine, never a fallback); whitespace_pattern and disable_additional_properties are
// refused unless neutral, structural_tag always.
absl::Status StructuredOutputsOptions(object so, bool* any_whitespace) {
  static constexpr std::string_view kKnown[] = {"json",
                                                "json_object",
                                                "regex",
                                                "choice",
                                                "grammar",
                                                "disable_any_whitespace",
                                                "disable_fallback",
                                                "whitespace_pattern",
                                                "disable_additional_properties"};
  for (auto [key, value] : so) {
    if (key == "structural_tag" && !value.is_null()) {
      return Bad("structured_outputs.structural_tag",
                 "is not supported by kvserve yet (json, json_object, regex, choice and grammar "
                 "are)");
    }
    if (key != "structural_tag" &&
        std::find(std::begin(kKnown), std::end(kKnown), key) == std::end(kKnown)) {
      return Bad(absl::StrCat("structured_outputs.", Sv(key.substr(0, 64))),
                 "is not a structured_outputs field kvserve serves");
    }
  }
  ASSIGN_OR_RETURN(bool compact,
                   NestedBool(so, "disable_any_whitespace",
                              "structured_outputs.disable_any_whitespace", !*any_whitespace));
  *any_whitespace = !compact;
  RETURN_IF_ERROR(
      NestedBool(so, "disable_fallback", "structured_outputs.disable_fallback", false).status());
  ASSIGN_OR_RETURN(bool closed,
                   NestedBool(so, "disable_additional_properties",
                              "structured_outputs.disable_additional_properties", false));
  if (Field(so, "whitespace_pattern")) {
    return Unserved("structured_outputs.whitespace_pattern", " (use disable_any_whitespace)");
  }
  if (closed) return Unserved("structured_outputs.disable_additional_properties", " or false");
  return absl::OkStatus();
}

}  // namespace

// The constraint of structured outputs: vLLM's guided_json / guided_regex / guided_choice /
// guided_grammar, structured_outputs {json | json_object | regex | choice | grammar}, or OpenAI's
// response_format; at most one; compiled here so that a bad one is a 400.
absl::Status ParseConstraint(object o, const RequestLimits& limits, ParsedRequest* r) {
  if (Field(o, "guided_whitespace_pattern")) {
    return Unserved("guided_whitespace_pattern",
                    " (JSON is compact, or any whitespace with "
                    "structured_outputs.disable_any_whitespace false)");
  }
  bool any_whitespace = limits.json_any_whitespace;
  std::vector<std::pair<std::string, element>> given;
  for (const char* key : {"guided_json", "guided_regex", "guided_choice", "guided_grammar"}) {
    if (auto e = Field(o, key)) given.emplace_back(key, *e);
  }
  if (auto e = Field(o, "response_format")) RETURN_IF_ERROR(ResponseFormat(*e, &given));
  if (auto e = Field(o, "structured_outputs")) {
    object so;
    if (e->get_object().get(so) != simdjson::SUCCESS) {
      return Bad("structured_outputs", "must be an object");
    }
    RETURN_IF_ERROR(StructuredOutputsOptions(so, &any_whitespace));
    if (auto f = Field(so, "json_object")) {
      if (!f->is_bool()) return Bad("structured_outputs.json_object", "must be a boolean");
      if (f->get_bool().value()) given.emplace_back("structured_outputs.json_object", *f);
    }
    for (const char* key : {"json", "regex", "choice", "grammar"}) {
      if (auto f = Field(so, key)) given.emplace_back(absl::StrCat("structured_outputs.", key), *f);
    }
  }
  if (given.empty()) return absl::OkStatus();
  if (given.size() > 1) {
    return Bad(given[1].first,
               absl::StrCat("only one constraint may be given; ", given[0].first, " is too"));
  }
  const auto& [param, e] = given[0];
  structured::ConstraintSpec spec;
  if (absl::EndsWith(param, "choice")) {
    RETURN_IF_ERROR(ChoiceList(e, param, limits, &spec));
  } else if (absl::EndsWith(param, "regex")) {
    RETURN_IF_ERROR(
        ConstraintText(e, param, limits, structured::ConstraintSpec::Kind::kRegex, &spec));
  } else if (absl::EndsWith(param, "grammar")) {
    RETURN_IF_ERROR(
        ConstraintText(e, param, limits, structured::ConstraintSpec::Kind::kGrammar, &spec));
  } else if (param == "response_format" || absl::EndsWith(param, "json_object")) {
    spec.kind = structured::ConstraintSpec::Kind::kJsonObject;
  } else {
    RETURN_IF_ERROR(SchemaText(e, param, limits, &spec));
  }
  if (spec.kind == structured::ConstraintSpec::Kind::kJsonSchema ||
      spec.kind == structured::ConstraintSpec::Kind::kJsonObject) {
    spec.any_whitespace = any_whitespace;
  }
  RETURN_IF_ERROR(CheckCompiles(spec, param));
  r->constraint = std::move(spec);
  return absl::OkStatus();
}

}  // namespace kvserve::frontend::request_fields
