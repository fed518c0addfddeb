// What JSON Schema's keywords say about values, apart from compiling them to a grammar
// (json_schema.cc): a value's type, its compact text, and the types and listed values a schema
// allows, which tell oneOf's branches apart.
#ifndef KVSERVE_COMMON_STRUCTURED_SCHEMA_VALUES_H_
#define KVSERVE_COMMON_STRUCTURED_SCHEMA_VALUES_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "nlohmann/json.hpp"

namespace kvserve::structured {

// Whether `v` is a JSON value of schema type `type` (an integral float is an "integer").
bool HasType(const nlohmann::ordered_json& v, std::string_view type);

// `v` as compact JSON writes it: the separators ", " and ": ", no other whitespace.
std::string CompactText(const nlohmann::ordered_json& v);

// The JSON types a schema's values can have, as bits in the order null, boolean, object, array,
// string, number ("integer" counted as "number"); 63 when it does not say.
uint32_t TypeBits(const nlohmann::ordered_json& s);

// The values a schema allows when it lists them (const / enum).
std::optional<std::vector<nlohmann::ordered_json>> ListedValues(const nlohmann::ordered_json& s);

// Whether two lists of values (ListedValues) share none; false when either is not a list.
bool Disjoint(const std::optional<std::vector<nlohmann::ordered_json>>& a,
              const std::optional<std::vector<nlohmann::ordered_json>>& b);

// Whether a required property of both object schemas takes listed values that differ (a tag).
bool Tagged(const nlohmann::ordered_json& a, const nlohmann::ordered_json& b);

}  // namespace kvserve::structured

#endif  // KVSERVE_COMMON_STRUCTURED_SCHEMA_VALUES_H_
