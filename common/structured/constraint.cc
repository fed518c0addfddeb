#include "common/structured/constraint.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/structured/nfa.h"
#include "common/structured/regex.h"
#include "common/utf8.h"

namespace kvserve::structured {

std::string ConstraintSpec::Key() const {
  if (kind == Kind::kRegex) return absl::StrCat("regex:", regex);
  std::string key = "choice";
  for (const std::string& c : choices) absl::StrAppend(&key, ":", c.size(), ":", c);
  return key;
}

absl::StatusOr<Dfa> CompileConstraint(const ConstraintSpec& spec) {
  if (spec.kind == ConstraintSpec::Kind::kRegex) return CompileRegex(spec.regex);
  if (spec.choices.empty()) return absl::InvalidArgumentError("the list of choices is empty");
  const RegexLimits limits;
  Nfa nfa(limits.max_nfa_states);
  std::optional<Nfa::Fragment> any;
  for (size_t i = 0; i < spec.choices.size(); ++i) {
    if (!IsValidUtf8(spec.choices[i])) {
      return absl::InvalidArgumentError(absl::StrCat("choice ", i, " is not valid UTF-8"));
    }
    const Nfa::Fragment f = nfa.Literal(spec.choices[i]);
    any = any ? nfa.Alternate(*any, f) : f;
  }
  return nfa.ToDfa(*any, limits.max_dfa_states, limits.max_work);
}

}  // namespace kvserve::structured
