#include "common/structured/json_schema.h"

#include <algorithm>
#include <cmath>
#include <list>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "common/string_util.h"
#include "common/structured/json_terminals.h"
#include "common/structured/regex.h"
#include "common/structured/schema_values.h"
#include "nlohmann/json.hpp"

namespace kvserve::structured {
namespace {

using Json = nlohmann::ordered_json;
using Fragment = Nfa::Fragment;

// Keywords that only annotate: no effect on what is valid.
const absl::flat_hash_set<std::string>& Annotations() {
  static const auto* k = new absl::flat_hash_set<std::string>{
      "title",       "description",      "default",         "examples", "$schema",   "$id",
      "id",          "$comment",         "deprecated",      "readOnly", "writeOnly", "$defs",
      "definitions", "contentMediaType", "contentEncoding", "$anchor",  "strict",    "name"};
  return *k;
}

// Keywords that constrain values and are not served: refused by name.
const absl::flat_hash_set<std::string>& Refused() {
  static const auto* k = new absl::flat_hash_set<std::string>{"not",
                                                              "if",
                                                              "then",
                                                              "else",
                                                              "dependencies",
                                                              "dependentRequired",
                                                              "dependentSchemas",
                                                              "propertyNames",
                                                              "unevaluatedProperties",
                                                              "unevaluatedItems",
                                                              "contains",
                                                              "minContains",
                                                              "maxContains",
                                                              "multipleOf",
                                                              "$dynamicRef",
                                                              "$recursiveRef",
                                                              "$dynamicAnchor",
                                                              "$recursiveAnchor"};
  return *k;
}

absl::Status Unsupported(std::string_view what, std::string_view path) {
  return absl::InvalidArgumentError(
      absl::StrCat("unsupported keyword '", Sv(what), "' at ", path.empty() ? "#" : Sv(path)));
}

absl::Status Invalid(std::string_view path, std::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("schema at ", path.empty() ? "#" : Sv(path), ": ", Sv(why)));
}

std::string Child(std::string_view path, std::string_view key) {
  return absl::StrCat(path.empty() ? "#" : Sv(path), "/", Sv(key));
}

bool HasValidation(const Json& s, std::initializer_list<std::string_view> except) {
  for (const auto& [key, value] : s.items()) {
    if (Annotations().contains(key)) continue;
    if (std::find(except.begin(), except.end(), key) == except.end()) return true;
  }
  return false;
}

// The $ref of a schema that is only a reference (annotations aside).
std::optional<std::string> PlainRef(const Json& s) {
  if (!s.is_object() || !s.contains("$ref") || !s["$ref"].is_string() ||
      HasValidation(s, {"$ref"})) {
    return std::nullopt;
  }
  return s["$ref"].get<std::string>();
}

// Whether `p` has a '|' outside groups and classes (then its anchors bind to one branch).
bool TopLevelAlternation(const std::string& p) {
  int depth = 0;
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] == '\\') {
      ++i;
    } else if (in_class) {
      in_class = p[i] != ']';
    } else if (p[i] == '[') {
      in_class = true;
    } else if (p[i] == '(') {
      ++depth;
    } else if (p[i] == ')') {
      --depth;
    } else if (p[i] == '|' && depth == 0) {
      return true;
    }
  }
  return false;
}

// JSON Schema's `pattern` matches anywhere in the string unless anchored: the whole-string
// regular expression that says the same.
std::string SearchPattern(const std::string& p) {
  bool head = !p.empty() && p.front() == '^', tail = false;
  if (p.size() > (head ? 1u : 0u) && p.back() == '$') {
    size_t backslashes = 0;  // an odd number escapes the '$'
    for (size_t k = p.size() - 1; k > 0 && p[k - 1] == '\\'; --k) ++backslashes;
    tail = backslashes % 2 == 0;
  }
  if (TopLevelAlternation(p)) head = tail = false;  // an anchor inside is refused by the parser
  const std::string core = p.substr(head ? 1 : 0, p.size() - (head ? 1 : 0) - (tail ? 1 : 0));
  return absl::StrCat(head ? "" : "[\\s\\S]*", "(?:", core, ")", tail ? "" : "[\\s\\S]*");
}

// patternProperties hold when no written key matches a pattern (only declared keys are written).
template <typename Members>
absl::Status CheckPatternProperties(const Json& patterns, const Members& members,
                                    const std::string& path) {
  if (!patterns.is_object()) return Invalid(path, "patternProperties must be an object");
  for (const auto& [pattern, schema] : patterns.items()) {
    absl::StatusOr<Dfa> dfa = CompileRegex(SearchPattern(pattern));
    if (!dfa.ok()) {
      return Invalid(path, absl::StrCat("patternProperties ", Json(pattern).dump(), ": ",
                                        dfa.status().message()));
    }
    for (const auto& m : members) {
      if (dfa->Matches(m.key)) {
        return Unsupported(absl::StrCat("patternProperties matching the property \"", m.key, "\""),
                           path);
      }
    }
  }
  return absl::OkStatus();
}

class SchemaCompiler {
 public:
  SchemaCompiler(const Json& root, const JsonSchemaOptions& options)
      : root_(root), options_(options), builder_(options.limits) {}

  absl::StatusOr<Grammar> Compile() && {
    const int32_t top = builder_.Declare("#");
    ASSIGN_OR_RETURN(Fragment body, Value(root_, "", 0));
    builder_.Define(top, nfa().Concat(Ws(), nfa().Concat(body, Ws())));
    return std::move(builder_).Build(top);
  }

 private:
  Nfa& nfa() { return builder_.nfa(); }

  // The whitespace allowed around a value and inside brackets: none in compact JSON.
  Fragment Ws() { return options_.any_whitespace ? FreeWs() : nfa().Empty(); }
  // A separator (',' or ':') and the whitespace around it: compact JSON writes ", " and ": ".
  Fragment Sep(char sep) {
    if (!options_.any_whitespace) return nfa().Literal(std::string{sep, ' '});
    return nfa().Concat(FreeWs(), nfa().Concat(nfa().Literal(std::string(1, sep)), FreeWs()));
  }
  Fragment FreeWs() {
    Fragment f = nfa().Empty();
    for (int i = 0; i < options_.max_whitespace; ++i) {
      f = nfa().Optional(
          nfa().Concat(nfa().CodePoints({{'\t', '\n'}, {'\r', '\r'}, {' ', ' '}}), f));
    }
    return f;
  }

  absl::StatusOr<std::pair<int64_t, int64_t>> Counts(const Json& s, std::string_view path,
                                                     const char* min_key, const char* max_key) {
    int64_t min = 0, max = -1;
    for (auto [key, out] : {std::pair{min_key, &min}, std::pair{max_key, &max}}) {
      if (!s.contains(key)) continue;
      const Json& v = s[key];
      if (!HasType(v, "integer") || v.get<double>() < 0) {
        return Invalid(path, absl::StrCat(key, " must be a non-negative integer"));
      }
      if (v.get<double>() > options_.max_repeat) {
        return Invalid(path, absl::StrCat(key, " above ", options_.max_repeat, " is not served"));
      }
      *out = v.get<int64_t>();
    }
    if (max >= 0 && min > max) return Invalid(path, absl::StrCat(min_key, " > ", max_key));
    return std::pair{min, max};
  }

  absl::Status CheckKeywords(const Json& s, std::string_view path) {
    for (const auto& [key, value] : s.items()) {
      if (Refused().contains(key)) return Unsupported(key, path);
    }
    if (s.contains("uniqueItems") && s["uniqueItems"] == true &&
        !(s.contains("maxItems") && HasType(s["maxItems"], "integer") &&
          s["maxItems"].get<double>() <= 1)) {
      return Unsupported("uniqueItems", path);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<Fragment> Value(const Json& s, const std::string& path, int depth) {
    if (depth > options_.max_schema_depth) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the schema nests deeper than ", options_.max_schema_depth, " levels at ", path));
    }
    if (s.is_boolean()) {
      if (!s.get<bool>()) return Invalid(path, "the schema false matches nothing");
      return nfa().Call(AnyValueRule());
    }
    if (!s.is_object()) return Invalid(path, "a schema must be an object or a boolean");
    RETURN_IF_ERROR(CheckKeywords(s, path));
    if (s.contains("$ref")) return Ref(s, path);
    if (s.contains("allOf")) return AllOf(s, path, depth);
    if (s.contains("anyOf") || s.contains("oneOf")) return AnyOf(s, path, depth);
    if (s.contains("const") || s.contains("enum")) return Enum(s, path);
    ASSIGN_OR_RETURN(std::vector<std::string> types, Types(s, path));
    std::optional<Fragment> out;
    for (const std::string& type : types) {
      ASSIGN_OR_RETURN(Fragment f, Typed(s, type, path, depth));
      out = out ? nfa().Alternate(*out, f) : f;
    }
    return *out;
  }

  absl::StatusOr<std::vector<std::string>> Types(const Json& s, std::string_view path) {
    static const std::vector<std::string> kAll = {"object", "array",   "string",
                                                  "number", "boolean", "null"};
    std::vector<std::string> types;
    if (s.contains("type")) {
      const Json& t = s["type"];
      for (const Json& one : t.is_array() ? t : Json::array({t})) {
        if (!one.is_string() ||
            (std::find(kAll.begin(), kAll.end(), one.get<std::string>()) == kAll.end() &&
             one != "integer")) {
          return Invalid(path, absl::StrCat("unknown type ", one.dump()));
        }
        types.push_back(one.get<std::string>());
      }
      if (types.empty()) return Invalid(path, "an empty list of types matches nothing");
      return types;
    }
    // No type: the types the keywords speak of (a part of what is valid), else any.
    auto has = [&](std::initializer_list<const char*> keys) {
      return std::any_of(keys.begin(), keys.end(), [&](const char* k) { return s.contains(k); });
    };
    if (has({"properties", "required", "additionalProperties", "minProperties", "maxProperties"})) {
      types.emplace_back("object");
    }
    if (has({"items", "prefixItems", "additionalItems", "minItems", "maxItems"})) {
      types.emplace_back("array");
    }
    if (has({"minLength", "maxLength", "pattern", "format"})) types.emplace_back("string");
    if (has({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})) {
      types.emplace_back("number");
    }
    return types.empty() ? kAll : types;
  }

  absl::StatusOr<Fragment> Typed(const Json& s, std::string_view type, const std::string& path,
                                 int depth) {
    if (type == "null") return nfa().Literal("null");
    if (type == "boolean") return nfa().Alternate(nfa().Literal("true"), nfa().Literal("false"));
    if (type == "string") return String(s, path);
    if (type == "integer") return Integer(s, path, /*integer=*/true);
    if (type == "number") return Integer(s, path, /*integer=*/false);
    const int32_t rule = builder_.Declare(absl::StrCat(path.empty() ? "#" : path, ":", Sv(type)));
    ASSIGN_OR_RETURN(Fragment body,
                     type == "object" ? Object(s, path, depth) : Array(s, path, depth));
    builder_.Define(rule, body);
    return nfa().Call(rule);
  }

  absl::StatusOr<Fragment> String(const Json& s, const std::string& path) {
    ASSIGN_OR_RETURN(auto counts, Counts(s, path, "minLength", "maxLength"));
    const bool bounded = s.contains("minLength") || s.contains("maxLength");
    std::optional<std::string> regex;
    if (s.contains("format")) {
      if (!s["format"].is_string()) return Invalid(path, "format must be a string");
      regex = FormatRegex(s["format"].get<std::string>());
      if (!regex)
        return Unsupported(absl::StrCat("format: ", s["format"].get<std::string>()), path);
    }
    if (s.contains("pattern")) {
      if (regex) return Unsupported("pattern together with format", path);
      if (!s["pattern"].is_string()) return Invalid(path, "pattern must be a string");
      regex = SearchPattern(s["pattern"].get<std::string>());
    }
    Fragment body;
    if (regex) {
      if (bounded) return Unsupported("minLength/maxLength together with pattern or format", path);
      absl::StatusOr<Dfa> dfa = CompileRegex(*regex);
      if (!dfa.ok()) return Invalid(path, absl::StrCat("pattern: ", dfa.status().message()));
      body = JsonEscaped(*dfa, nfa());
    } else {
      ASSIGN_OR_RETURN(body,
                       Repeat(
                           nfa(), [&]() -> absl::StatusOr<Fragment> { return JsonChar(nfa()); },
                           counts.first, counts.second));
    }
    return nfa().Concat(nfa().Literal("\""), nfa().Concat(body, nfa().Literal("\"")));
  }

  // Integers (and, for `number` without bounds, decimals) within the bounds.
  absl::StatusOr<Fragment> Integer(const Json& s, const std::string& path, bool integer) {
    std::optional<int64_t> lo, hi;
    struct Bound {
      const char* key;
      bool lower, exclusive;
      const char* draft4_flag;  // draft 4: exclusiveMinimum / exclusiveMaximum are flags
    };
    for (const Bound& b : {Bound{"minimum", true, false, "exclusiveMinimum"},
                           Bound{"exclusiveMinimum", true, true, nullptr},
                           Bound{"maximum", false, false, "exclusiveMaximum"},
                           Bound{"exclusiveMaximum", false, true, nullptr}}) {
      if (!s.contains(b.key) || s[b.key].is_boolean()) continue;
      if (!s[b.key].is_number()) return Invalid(path, absl::StrCat(b.key, " must be a number"));
      const bool exclusive = b.exclusive || (s.contains(b.draft4_flag) && s[b.draft4_flag] == true);
      const double x = s[b.key].get<double>();
      if (std::fabs(x) > 1e18) continue;  // past what the ranges write: unbounded there
      double bound = b.lower ? std::ceil(x) : std::floor(x);
      if (exclusive && bound == x) bound += b.lower ? 1 : -1;
      const auto v = static_cast<int64_t>(bound);
      if (b.lower) {
        lo = lo ? std::max(*lo, v) : v;
      } else {
        hi = hi ? std::min(*hi, v) : v;
      }
    }
    if (lo && hi && *lo > *hi) return Invalid(path, "no integer lies within the bounds");
    if (!integer && !lo && !hi) {
      return AddPattern("-?(?:0|[1-9][0-9]*)(?:\\.[0-9]+)?(?:[eE][+-]?[0-9]+)?", path);
    }
    return AddPattern(IntegerRangeRegex(lo, hi), path);
  }

  absl::StatusOr<Fragment> AddPattern(const std::string& regex, std::string_view path) {
    absl::StatusOr<Fragment> f = AddRegex(regex, nfa());
    if (!f.ok()) return Invalid(path, std::string(f.status().message()));
    return *f;
  }

  absl::StatusOr<Fragment> Object(const Json& s, const std::string& path, int depth);
  absl::StatusOr<Fragment> Array(const Json& s, const std::string& path, int depth);
  absl::StatusOr<Fragment> Enum(const Json& s, const std::string& path);
  absl::StatusOr<Fragment> Ref(const Json& s, const std::string& path);
  absl::StatusOr<Fragment> AllOf(const Json& s, const std::string& path, int depth);
  absl::StatusOr<Fragment> AnyOf(const Json& s, const std::string& path, int depth);
  absl::Status CheckExclusive(const Json& branches, const std::string& path);
  absl::StatusOr<const Json*> Resolve(std::string_view ref, std::string_view path);
  int32_t AnyValueRule();

  const Json& root_;
  JsonSchemaOptions options_;
  GrammarBuilder builder_;
  std::map<std::string, int32_t> ref_rules_;
  std::optional<int32_t> any_value_;
  std::list<Json> merged_;  // schemas made by merging (kept alive while compiling)
};

absl::StatusOr<Fragment> SchemaCompiler::Object(const Json& s, const std::string& path, int depth) {
  static const Json kAny = true, kNone = Json::object();
  const Json& properties = s.contains("properties") ? s["properties"] : kNone;
  if (!properties.is_object()) return Invalid(path, "properties must be an object");
  struct Member {
    std::string key;
    const Json* schema;
    bool required;
  };
  std::vector<Member> members;
  absl::flat_hash_set<std::string> required;
  if (s.contains("required")) {
    if (!s["required"].is_array()) return Invalid(path, "required must be an array");
    for (const Json& r : s["required"]) {
      if (!r.is_string()) return Invalid(path, "required must list strings");
      required.insert(r.get<std::string>());
    }
  }
  for (const auto& [key, schema] : properties.items()) {
    members.push_back({key, &schema, required.contains(key)});
  }
  for (const Json& r : s.value("required", Json::array())) {
    const std::string name = r.get<std::string>();
    if (!properties.contains(name)) members.push_back({name, &kAny, true});
  }
  const Json* extra = nullptr;  // the schema of members past the declared ones
  if (!s.contains("additionalProperties")) {
    if (properties.empty()) extra = &kAny;
  } else if (const Json& ap = s["additionalProperties"]; ap.is_boolean() || ap.is_object()) {
    if (properties.empty() && ap != false) extra = &ap;
  } else {
    return Invalid(path, "additionalProperties must be a schema");
  }
  if (s.contains("patternProperties")) {
    RETURN_IF_ERROR(CheckPatternProperties(s["patternProperties"], members, path));
    extra = nullptr;  // a key past the declared ones could match a pattern: none is written
  }
  const auto num_required = static_cast<int64_t>(required.size());
  ASSIGN_OR_RETURN(auto counts, Counts(s, path, "minProperties", "maxProperties"));
  if (counts.first > num_required) return Unsupported("minProperties", path);
  if (counts.second >= 0 && (extra || static_cast<int64_t>(members.size()) > counts.second)) {
    return Unsupported("maxProperties", path);
  }
  // `a`: nothing written yet, `b`: some member written (the next one needs a comma).
  const Fragment open = nfa().Concat(nfa().Literal("{"), Ws());
  int32_t a = nfa().AddState(), b = nfa().AddState();
  nfa().Link(open.end, a);
  auto add_member = [&](Fragment key, Fragment value, int32_t from_a, int32_t from_b) {
    const Fragment member = nfa().Concat(key, nfa().Concat(Sep(':'), value));
    const Fragment comma = Sep(',');
    nfa().Link(from_a, member.start);
    nfa().Link(from_b, comma.start);
    nfa().Link(comma.end, member.start);
    return member.end;
  };
  for (const Member& m : members) {
    ASSIGN_OR_RETURN(Fragment value,
                     Value(*m.schema, Child(path, "properties/" + m.key), depth + 1));
    const int32_t next_a = nfa().AddState(), next_b = nfa().AddState();
    nfa().Link(add_member(nfa().Literal(Json(m.key).dump()), value, a, b), next_b);
    if (!m.required) nfa().Link(a, next_a), nfa().Link(b, next_b);
    a = next_a;
    b = next_b;
  }
  if (extra) {
    ASSIGN_OR_RETURN(Fragment value, Value(*extra, Child(path, "additionalProperties"), depth + 1));
    const Fragment key = nfa().Concat(
        nfa().Literal("\""), nfa().Concat(nfa().Star(JsonChar(nfa())), nfa().Literal("\"")));
    nfa().Link(add_member(key, value, a, b), b);
  }
  // One run of whitespace between two tokens: "{" ws "}" or "{" ws member ws "}".
  const Fragment close = nfa().Literal("}");
  const Fragment spaced_close = nfa().Concat(Ws(), close);
  nfa().Link(a, close.start);
  nfa().Link(b, spaced_close.start);
  return Fragment{open.start, close.end};
}

absl::StatusOr<Fragment> SchemaCompiler::Array(const Json& s, const std::string& path, int depth) {
  ASSIGN_OR_RETURN(auto counts, Counts(s, path, "minItems", "maxItems"));
  const auto [min, max] = counts;
  auto comma = [&] { return Sep(','); };
  if (s.contains("prefixItems") && !s["prefixItems"].is_array()) {
    return Invalid(path, "prefixItems must be an array");
  }
  const Json* tuple = s.contains("prefixItems")                      ? &s["prefixItems"]
                      : s.contains("items") && s["items"].is_array() ? &s["items"]
                                                                     : nullptr;
  std::optional<Fragment> body;  // the items, when some may be written
  bool optional = false;
  if (tuple) {
    const auto k = static_cast<int64_t>(tuple->size());
    if (k < min || (max >= 0 && k > max)) {
      return Unsupported("minItems/maxItems other than the length of a tuple", path);
    }
    for (int64_t i = 0; i < k; ++i) {
      ASSIGN_OR_RETURN(Fragment item,
                       Value((*tuple)[i], Child(path, absl::StrCat("items/", i)), depth + 1));
      body = i == 0 ? item : nfa().Concat(*body, nfa().Concat(comma(), item));
    }
  } else if (max != 0 && !(s.contains("items") && s["items"] == false)) {
    static const Json kAny = true;
    const int32_t rule = builder_.Declare(Child(path, "items"));
    ASSIGN_OR_RETURN(Fragment item, Value(s.contains("items") ? s["items"] : kAny,
                                          Child(path, "items"), depth + 1));
    builder_.Define(rule, item);
    ASSIGN_OR_RETURN(Fragment rest, Repeat(
                                        nfa(),
                                        [&]() -> absl::StatusOr<Fragment> {
                                          return nfa().Concat(comma(), nfa().Call(rule));
                                        },
                                        std::max<int64_t>(min - 1, 0), max < 0 ? -1 : max - 1));
    body = nfa().Concat(nfa().Call(rule), rest);
    optional = min == 0;
  } else if (min > 0) {
    return Invalid(path, "minItems above 0 with no items allowed");
  }
  // One run of whitespace between two tokens: "[" ws "]" or "[" ws items ws "]".
  Fragment inside = nfa().Empty();
  if (body) inside = nfa().Concat(*body, Ws());
  if (body && optional) inside = nfa().Optional(inside);
  return nfa().Concat(nfa().Concat(nfa().Literal("["), Ws()),
                      nfa().Concat(inside, nfa().Literal("]")));
}

absl::StatusOr<Fragment> SchemaCompiler::Enum(const Json& s, const std::string& path) {
  if (HasValidation(s, {"const", "enum", "type"})) {
    return Unsupported(
        s.contains("const") ? "const with other keywords" : "enum with other keywords", path);
  }
  Json values = Json::array();
  if (s.contains("enum")) {
    if (!s["enum"].is_array()) return Invalid(path, "enum must be an array");
    values = s["enum"];
  }
  if (s.contains("const")) {
    if (s.contains("enum") && std::find(values.begin(), values.end(), s["const"]) == values.end()) {
      return Invalid(path, "const is not one of enum");
    }
    values = Json::array({s["const"]});
  }
  std::optional<Fragment> out;
  for (const Json& v : values) {
    bool typed = !s.contains("type");
    for (const Json& t : s.contains("type") && s["type"].is_array()
                             ? s["type"]
                             : Json::array({s.value("type", Json())})) {
      typed = typed || (t.is_string() && HasType(v, t.get<std::string>()));
    }
    if (!typed) continue;
    const Fragment f = nfa().Literal(options_.any_whitespace ? v.dump() : CompactText(v));
    out = out ? nfa().Alternate(*out, f) : f;
  }
  if (!out) return Invalid(path, "no value of enum/const has the schema's type");
  return *out;
}

// `text` with its %XX escapes decoded (a URI fragment's).
std::string PercentDecoded(std::string_view text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    int value = 0;
    if (text[i] == '%' && i + 2 < text.size() &&
        absl::SimpleHexAtoi(Sv(text.substr(i + 1, 2)), &value)) {
      out += static_cast<char>(value);
      i += 2;
    } else {
      out += text[i];
    }
  }
  return out;
}

absl::StatusOr<const Json*> SchemaCompiler::Resolve(std::string_view ref, std::string_view path) {
  if (ref.empty() || ref[0] != '#') return Unsupported("$ref to another document", path);
  const Json* at = &root_;
  if (ref.size() == 1) return at;
  if (ref[1] != '/') return Unsupported("$ref to an anchor", path);
  const std::string pointer = PercentDecoded(ref.substr(2));
  for (absl::string_view token : absl::StrSplit(pointer, '/')) {
    std::string key;
    for (size_t i = 0; i < token.size(); ++i) {
      if (token[i] == '~' && i + 1 < token.size() && (token[i + 1] == '0' || token[i + 1] == '1')) {
        key += token[++i] == '0' ? '~' : '/';
      } else {
        key += token[i];
      }
    }
    if (at->is_object() && at->contains(key)) {
      at = &(*at)[key];
    } else if (at->is_array() && !key.empty() && key.size() <= 9 &&
               key.find_first_not_of("0123456789") == std::string::npos &&
               std::stoull(key) < at->size()) {
      at = &(*at)[std::stoull(key)];
    } else {
      return Invalid(path, absl::StrCat("$ref ", Sv(ref), " does not resolve"));
    }
  }
  return at;
}

absl::StatusOr<Fragment> SchemaCompiler::Ref(const Json& s, const std::string& path) {
  if (!s["$ref"].is_string()) return Invalid(path, "$ref must be a string");
  if (HasValidation(s, {"$ref"})) return Unsupported("$ref with sibling keywords", path);
  const std::string ref = s["$ref"].get<std::string>();
  if (auto it = ref_rules_.find(ref); it != ref_rules_.end()) return nfa().Call(it->second);
  ASSIGN_OR_RETURN(const Json* target, Resolve(ref, path));
  const int32_t rule = builder_.Declare(ref);
  ref_rules_[ref] = rule;
  ASSIGN_OR_RETURN(Fragment body, Value(*target, ref, 0));
  builder_.Define(rule, body);
  return nfa().Call(rule);
}

// The schema that is `a` and `b` at once, for keywords that do not meet or meet with equal
// values (properties and required are joined); nullopt names a keyword that conflicts.
std::variant<Json, std::string> Merge(Json a, const Json& b) {
  for (const auto& [key, value] : b.items()) {
    if (Annotations().contains(key) && key != "$defs" && key != "definitions") continue;
    if (!a.contains(key) || a[key] == value) {
      a[key] = value;
    } else if (key == "required" && value.is_array() && a[key].is_array()) {
      for (const Json& r : value) {
        if (std::find(a[key].begin(), a[key].end(), r) == a[key].end()) a[key].push_back(r);
      }
    } else if (key == "properties" && value.is_object() && a[key].is_object()) {
      for (const auto& [name, schema] : value.items()) {
        if (a[key].contains(name) && a[key][name] != schema) return "properties/" + name;
        a[key][name] = schema;
      }
    } else {
      return key;
    }
  }
  return a;
}

absl::StatusOr<Fragment> SchemaCompiler::AllOf(const Json& s, const std::string& path, int depth) {
  if (!s["allOf"].is_array() || s["allOf"].empty()) {
    return Invalid(path, "allOf must be a non-empty array");
  }
  Json merged = s;
  merged.erase("allOf");
  for (const Json& part : s["allOf"]) {
    const Json* p = &part;
    if (p->is_boolean()) {
      if (!p->get<bool>()) return Invalid(path, "allOf holds the schema false");
      continue;
    }
    if (!p->is_object()) return Invalid(path, "allOf must hold schemas");
    if (const std::optional<std::string> ref = PlainRef(*p)) {
      ASSIGN_OR_RETURN(p, Resolve(*ref, path));
    }
    auto m = Merge(std::move(merged), *p);
    if (auto* conflict = std::get_if<std::string>(&m)) {
      return Unsupported(absl::StrCat("allOf whose parts both set '", *conflict, "'"), path);
    }
    merged = std::get<Json>(std::move(m));
  }
  merged_.push_back(std::move(merged));
  return Value(merged_.back(), path, depth + 1);
}

absl::StatusOr<Fragment> SchemaCompiler::AnyOf(const Json& s, const std::string& path, int depth) {
  if (s.contains("anyOf") && s.contains("oneOf")) return Unsupported("anyOf with oneOf", path);
  const char* key = s.contains("anyOf") ? "anyOf" : "oneOf";
  const Json& branches = s[key];
  if (!branches.is_array() || branches.empty()) {
    return Invalid(path, absl::StrCat(key, " must be a non-empty array"));
  }
  if (key[0] == 'o') RETURN_IF_ERROR(CheckExclusive(branches, path));
  Json siblings = s;
  siblings.erase(key);
  const bool merge = HasValidation(siblings, {});
  std::optional<Fragment> out;
  for (size_t i = 0; i < branches.size(); ++i) {
    const std::string at = Child(path, absl::StrCat(key, "/", i));
    const Json* branch = &branches[i];
    if (merge) {
      if (const std::optional<std::string> ref = PlainRef(*branch)) {
        ASSIGN_OR_RETURN(branch, Resolve(*ref, at));
      }
      if (!branch->is_object()) return Unsupported(absl::StrCat(key, " of boolean schemas"), path);
      auto m = Merge(siblings, *branch);
      if (auto* conflict = std::get_if<std::string>(&m)) {
        return Unsupported(
            absl::StrCat(key, " whose branch and siblings both set '", *conflict, "'"), at);
      }
      merged_.push_back(std::get<Json>(std::move(m)));
      branch = &merged_.back();
    }
    ASSIGN_OR_RETURN(Fragment f, Value(*branch, at, depth + 1));
    out = out ? nfa().Alternate(*out, f) : f;
  }
  return *out;
}

absl::Status SchemaCompiler::CheckExclusive(const Json& branches, const std::string& path) {
  std::vector<const Json*> resolved;
  for (const Json& b : branches) {
    const Json* r = &b;
    if (b.is_object() && b.contains("$ref") && b["$ref"].is_string()) {
      ASSIGN_OR_RETURN(r, Resolve(b["$ref"].get<std::string>(), path));
    }
    resolved.push_back(r);
  }
  for (size_t i = 0; i < resolved.size(); ++i) {
    for (size_t j = i + 1; j < resolved.size(); ++j) {
      const Json& a = *resolved[i];
      const Json& b = *resolved[j];
      if ((TypeBits(a) & TypeBits(b)) == 0 || Disjoint(ListedValues(a), ListedValues(b)) ||
          (a.is_object() && b.is_object() && Tagged(a, b))) {
        continue;
      }
      return Unsupported(
          absl::StrCat("oneOf whose branches ", i, " and ", j,
                       " may both match a value (use anyOf, or tell them apart by type, enum or a "
                       "required const property)"),
          path);
    }
  }
  return absl::OkStatus();
}

int32_t SchemaCompiler::AnyValueRule() {
  if (any_value_) return *any_value_;
  const int32_t v = builder_.Declare("any JSON value");
  any_value_ = v;
  auto string = [&] {
    return nfa().Concat(nfa().Literal("\""),
                        nfa().Concat(nfa().Star(JsonChar(nfa())), nfa().Literal("\"")));
  };
  auto comma = [&] { return Sep(','); };
  auto member = [&] { return nfa().Concat(string(), nfa().Concat(Sep(':'), nfa().Call(v))); };
  auto list = [&](auto item) {  // item (, item)* ws, or nothing
    return nfa().Optional(
        nfa().Concat(nfa().Concat(item(), nfa().Star(nfa().Concat(comma(), item()))), Ws()));
  };
  auto wrap = [&](const char* open, Fragment body, const char* close) {
    return nfa().Concat(nfa().Concat(nfa().Literal(open), Ws()),
                        nfa().Concat(body, nfa().Literal(close)));
  };
  const Fragment number = *AddRegex("-?(?:0|[1-9][0-9]*)(?:\\.[0-9]+)?(?:[eE][+-]?[0-9]+)?", nfa());
  Fragment f = nfa().Alternate(wrap("{", list(member), "}"),
                               wrap("[", list([&] { return nfa().Call(v); }), "]"));
  f = nfa().Alternate(f, nfa().Alternate(string(), number));
  for (const char* word : {"true", "false", "null"}) f = nfa().Alternate(f, nfa().Literal(word));
  builder_.Define(v, f);
  return v;
}

}  // namespace

absl::StatusOr<Grammar> CompileJsonSchema(std::string_view schema,
                                          const JsonSchemaOptions& options) {
  const Json root = Json::parse(schema, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return absl::InvalidArgumentError("the schema is not valid JSON");
  return SchemaCompiler(root, options).Compile();
}

absl::StatusOr<Grammar> JsonObjectGrammar(const JsonSchemaOptions& options) {
  return CompileJsonSchema(R"({"type": "object"})", options);
}

}  // namespace kvserve::structured
