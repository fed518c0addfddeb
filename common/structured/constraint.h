// What a request constrains its output to, as the router receives it and the worker compiles
// it (docs/STRUCTURED_OUTPUTS.md): a regular expression over the whole output, one of a list of
// strings, JSON valid under a schema, any JSON object, or a sentence of a GBNF grammar. The router
// compiles it too, to refuse a bad one with a 400 before routing.
//
//   ConstraintSpec spec{.kind = ConstraintSpec::Kind::kRegex, .regex = "\\d{3}"};
//   ASSIGN_OR_RETURN(Grammar g, CompileConstraint(spec));
//
// Pure functions; any thread.
#ifndef KVSERVE_COMMON_STRUCTURED_CONSTRAINT_H_
#define KVSERVE_COMMON_STRUCTURED_CONSTRAINT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/structured/grammar.h"

namespace kvserve::structured {

struct ConstraintSpec {
  enum class Kind { kRegex, kChoice, kJsonSchema, kJsonObject, kGrammar };
  Kind kind = Kind::kRegex;
  std::string regex;                 // kRegex: ECMAScript syntax (common/structured/regex.h)
  std::vector<std::string> choices;  // kChoice: the output is exactly one of them
  std::string json_schema;           // kJsonSchema: a JSON text (common/structured/json_schema.h)
  std::string grammar;               // kGrammar: GBNF (common/structured/gbnf.h)
  // kJsonSchema, kJsonObject: any whitespace between tokens instead of compact JSON
  // (JsonSchemaOptions::any_whitespace).
  bool any_whitespace = false;

  // With a reasoning model: the constraint holds after a reasoning block `start`...`end` (any
  // text without `end`) and up to 4 bytes of whitespace, which may be left out; `inside`: the
  // prompt opened the block, so the
  // output starts in it and must close it. Empty tags: no reasoning block.
  struct Reasoning {
    std::string start, end;
    bool inside = false;
    bool operator==(const Reasoning&) const = default;
  };
  Reasoning reasoning;

  // The source as one string (a cache key).
  [[nodiscard]] std::string Key() const;
  [[nodiscard]] std::string ContentKey() const;  // the same without the reasoning block
  bool operator==(const ConstraintSpec&) const = default;
};

// The grammar of `spec` (one rule for a regex or choice). InvalidArgument for a bad pattern, an
// empty list of choices (or one that is not UTF-8), a bad or unsupported schema;
// ResourceExhausted past the automata's limits.
absl::StatusOr<Grammar> CompileConstraint(const ConstraintSpec& spec);

}  // namespace kvserve::structured

#endif  // KVSERVE_COMMON_STRUCTURED_CONSTRAINT_H_
