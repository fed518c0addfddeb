// What a request constrains its output to, as the router receives it and the worker compiles
// it (docs/STRUCTURED_OUTPUTS.md): a regular expression over the whole output, or one of a list
// of strings. The router compiles it too, to refuse a bad one with a 400 before routing.
//
//   ConstraintSpec spec{.kind = ConstraintSpec::Kind::kRegex, .regex = "\\d{3}"};
//   ASSIGN_OR_RETURN(Dfa dfa, CompileConstraint(spec));
//
// Pure functions; any thread.
#ifndef KVSERVE_COMMON_STRUCTURED_CONSTRAINT_H_
#define KVSERVE_COMMON_STRUCTURED_CONSTRAINT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/structured/dfa.h"

namespace kvserve::structured {

struct ConstraintSpec {
  enum class Kind { kRegex, kChoice };
  Kind kind = Kind::kRegex;
  std::string regex;                 // kRegex: ECMAScript syntax (common/structured/regex.h)
  std::vector<std::string> choices;  // kChoice: the output is exactly one of them

  // The source as one string (a cache key).
  [[nodiscard]] std::string Key() const;
  bool operator==(const ConstraintSpec&) const = default;
};

// The automaton of `spec`. InvalidArgument for a bad pattern or an empty list of choices (or
// one that is not UTF-8); ResourceExhausted past the automaton's limits.
absl::StatusOr<Dfa> CompileConstraint(const ConstraintSpec& spec);

}  // namespace kvserve::structured

#endif  // KVSERVE_COMMON_STRUCTURED_CONSTRAINT_H_
