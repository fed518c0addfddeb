// JSON schemas (and "any JSON object", OpenAI's json_object) as grammars over bytes
// (docs/STRUCTURED_OUTPUTS.md has the served keywords). What is generated is always valid under
// the schema, sometimes a part of what the schema allows: properties come in the schema's
// order, only declared properties when `properties` is given, whitespace between tokens is
// compact or bounded (JsonSchemaOptions), a bounded `number` draws integers. A keyword whose
// meaning cannot be kept is refused
// with InvalidArgument naming the keyword and where it is (a JSON pointer), never ignored.
//
//   ASSIGN_OR_RETURN(Grammar g, CompileJsonSchema(R"({"type": "object", ...})"));
//
// Pure functions; any thread.
#ifndef KVSERVE_COMMON_STRUCTURED_JSON_SCHEMA_H_
#define KVSERVE_COMMON_STRUCTURED_JSON_SCHEMA_H_

#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/structured/grammar.h"

namespace kvserve::structured {

struct JsonSchemaOptions {
  // false (the default): compact JSON, OpenAI's strict-mode and llguidance's form: the
  // separators ", " and ": " and no other whitespace between tokens, so that an unsure model
  // cannot spend its tokens on blanks. true: any whitespace (space, tab, newline, carriage
  // return) in each gap between two tokens, up to max_whitespace bytes (xgrammar's
  // any_whitespace, vLLM's default).
  bool any_whitespace = false;
  int32_t max_whitespace = 20;
  int32_t max_schema_depth = 64;  // nesting of schema objects compiled inline
  int32_t max_repeat = 1000;      // the largest minLength/maxLength/minItems/maxItems served
  GrammarLimits limits;
};

// The grammar of the JSON texts valid under `schema` (a JSON text).
absl::StatusOr<Grammar> CompileJsonSchema(std::string_view schema,
                                          const JsonSchemaOptions& options = {});

// Any JSON object (response_format json_object).
absl::StatusOr<Grammar> JsonObjectGrammar(const JsonSchemaOptions& options = {});

}  // namespace kvserve::structured

#endif  // KVSERVE_COMMON_STRUCTURED_JSON_SCHEMA_H_
