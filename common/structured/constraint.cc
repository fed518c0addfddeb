#include "common/structured/constraint.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/structured/gbnf.h"
#include "common/structured/json_schema.h"
#include "common/structured/nfa.h"
#include "common/structured/regex.h"
#include "common/utf8.h"

namespace kvserve::structured {

std::string ConstraintSpec::Key() const {
  if (kind == Kind::kRegex) return absl::StrCat("regex:", regex);
  if (kind == Kind::kJsonSchema) return absl::StrCat("json:", json_schema);
  if (kind == Kind::kJsonObject) return "json_object";
  if (kind == Kind::kGrammar) return absl::StrCat("gbnf:", grammar);
  std::string key = "choice";
  for (const std::string& c : choices) absl::StrAppend(&key, ":", c.size(), ":", c);
  return key;
}

absl::StatusOr<Grammar> CompileConstraint(const ConstraintSpec& spec) {
  switch (spec.kind) {
    case ConstraintSpec::Kind::kRegex: {
      ASSIGN_OR_RETURN(Dfa dfa, CompileRegex(spec.regex));
      return SingleRuleGrammar(std::move(dfa));
    }
    case ConstraintSpec::Kind::kJsonSchema:
      return CompileJsonSchema(spec.json_schema);
    case ConstraintSpec::Kind::kJsonObject:
      return JsonObjectGrammar();
    case ConstraintSpec::Kind::kGrammar:
      return CompileGbnf(spec.grammar);
    case ConstraintSpec::Kind::kChoice:
      break;
  }
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
  ASSIGN_OR_RETURN(Dfa dfa, nfa.ToDfa(*any, limits.max_dfa_states, limits.max_work));
  return SingleRuleGrammar(std::move(dfa));
}

}  // namespace kvserve::structured
