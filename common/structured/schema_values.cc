#include "common/structured/schema_values.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace kvserve::structured {

using Json = nlohmann::ordered_json;

bool HasType(const Json& v, std::string_view type) {
  if (type == "null") return v.is_null();
  if (type == "boolean") return v.is_boolean();
  if (type == "object") return v.is_object();
  if (type == "array") return v.is_array();
  if (type == "string") return v.is_string();
  if (type == "number") return v.is_number();
  if (type == "integer") {
    return v.is_number_integer() ||
           (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
  }
  return false;
}

std::string CompactText(const Json& v) {
  if (!v.is_structured()) return v.dump();
  std::string out(1, v.is_object() ? '{' : '[');
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (it != v.begin()) out += ", ";
    if (v.is_object()) absl::StrAppend(&out, Json(it.key()).dump(), ": ");
    out += CompactText(*it);
  }
  out += v.is_object() ? '}' : ']';
  return out;
}

uint32_t TypeBits(const Json& s) {
  static const std::vector<std::string> kTypes = {"null",  "boolean", "object",
                                                  "array", "string",  "number"};
  auto bit_of_value = [&](const Json& v) {
    uint32_t bits = 0;
    for (size_t t = 0; t < kTypes.size(); ++t) bits |= HasType(v, kTypes[t]) ? 1u << t : 0;
    return bits;
  };
  if (!s.is_object()) return 63;
  if (s.contains("const")) return bit_of_value(s["const"]);
  if (s.contains("enum") && s["enum"].is_array()) {
    uint32_t bits = 0;
    for (const Json& v : s["enum"]) bits |= bit_of_value(v);
    return bits;
  }
  if (!s.contains("type")) return 63;
  uint32_t bits = 0;
  const Json& t = s["type"];
  for (const Json& one : t.is_array() ? t : Json::array({t})) {
    const std::string name = one.is_string() ? one.get<std::string>() : "";
    for (size_t k = 0; k < kTypes.size(); ++k) {
      if (name == kTypes[k] || (name == "integer" && kTypes[k] == "number")) bits |= 1u << k;
    }
  }
  return bits;
}

std::optional<std::vector<Json>> ListedValues(const Json& s) {
  if (!s.is_object()) return std::nullopt;
  if (s.contains("const")) return std::vector<Json>{s["const"]};
  if (s.contains("enum") && s["enum"].is_array()) {
    return std::vector<Json>(s["enum"].begin(), s["enum"].end());
  }
  return std::nullopt;
}

bool Disjoint(const std::optional<std::vector<Json>>& a,
              const std::optional<std::vector<Json>>& b) {
  if (!a || !b) return false;
  return std::none_of(a->begin(), a->end(), [&](const Json& v) {
    return std::find(b->begin(), b->end(), v) != b->end();
  });
}

bool Tagged(const Json& a, const Json& b) {
  auto required = [](const Json& s, const std::string& name) {
    const Json r = s.value("required", Json::array());
    return r.is_array() && std::find(r.begin(), r.end(), name) != r.end();
  };
  if (!a.contains("properties") || !b.contains("properties")) return false;
  for (const auto& [name, schema] : a["properties"].items()) {
    if (!b["properties"].contains(name) || !required(a, name) || !required(b, name)) continue;
    if (Disjoint(ListedValues(schema), ListedValues(b["properties"][name]))) return true;
  }
  return false;
}

}  // namespace kvserve::structured
