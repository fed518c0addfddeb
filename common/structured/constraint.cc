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

namespace {

// Any bytes without `end`, then `end`: the automaton of the longest-proper-border (KMP) kind,
// a state per matched prefix of `end`.
Nfa::Fragment UntilClosed(const std::string& end, Nfa& nfa) {
  const size_t n = end.size();
  std::vector<int32_t> at(n + 1);
  for (int32_t& s : at) s = nfa.AddState();
  for (size_t matched = 0; matched < n; ++matched) {
    for (int b = 0; b < 256; ++b) {
      // The longest prefix of `end` that is a suffix of end[0, matched) + b.
      std::string seen = end.substr(0, matched) + static_cast<char>(b);
      size_t k = std::min(seen.size(), n);
      while (k > 0 && seen.compare(seen.size() - k, k, end, 0, k) != 0) --k;
      nfa.AddEdge(at[matched], static_cast<uint8_t>(b), static_cast<uint8_t>(b), at[k]);
    }
  }
  return {at[0], at[n]};
}

absl::StatusOr<Grammar> WithReasoning(Grammar g, const ConstraintSpec::Reasoning& r) {
  constexpr size_t kMaxTag = 64;
  if (r.start.empty() || r.end.empty() || r.start.size() > kMaxTag || r.end.size() > kMaxTag) {
    return absl::InvalidArgumentError(
        absl::StrCat("a reasoning block needs start and end tags of 1 to ", kMaxTag, " bytes"));
  }
  Nfa nfa;
  // The end tag and the blank a reasoning model writes after it (Qwen3: "</think>\n\n"), up to
  // kMaxGap bytes, before the constrained text.
  constexpr int kMaxGap = 4;
  Nfa::Fragment gap = nfa.Empty();
  for (int i = 0; i < kMaxGap; ++i) {
    gap = nfa.Optional(nfa.Concat(nfa.CodePoints({{'\t', '\n'}, {'\r', '\r'}, {' ', ' '}}), gap));
  }
  const Nfa::Fragment closed = nfa.Concat(UntilClosed(r.end, nfa), gap);
  const Nfa::Fragment block =
      r.inside ? closed : nfa.Optional(nfa.Concat(nfa.Literal(r.start), closed));
  ASSIGN_OR_RETURN(Dfa prefix, nfa.ToDfa(block, /*max_states=*/1000));
  return PrefixedGrammar(std::move(g), prefix);
}

absl::StatusOr<Grammar> CompileContent(const ConstraintSpec& spec);

}  // namespace

absl::StatusOr<Grammar> CompileConstraint(const ConstraintSpec& spec) {
  ASSIGN_OR_RETURN(Grammar g, CompileContent(spec));
  if (spec.reasoning == ConstraintSpec::Reasoning{}) return g;
  return WithReasoning(std::move(g), spec.reasoning);
}

std::string ConstraintSpec::Key() const {
  std::string key;
  if (reasoning != Reasoning{}) {
    absl::StrAppend(&key, "reasoning:", reasoning.inside ? "in:" : "", reasoning.start.size(), ":",
                    reasoning.start, reasoning.end.size(), ":", reasoning.end, ":");
  }
  return key + ContentKey();
}

std::string ConstraintSpec::ContentKey() const {
  if (kind == Kind::kRegex) return absl::StrCat("regex:", regex);
  const char* ws = any_whitespace ? "ws:" : "";
  if (kind == Kind::kJsonSchema) return absl::StrCat("json:", ws, json_schema);
  if (kind == Kind::kJsonObject) return absl::StrCat("json_object", ws);
  if (kind == Kind::kGrammar) return absl::StrCat("gbnf:", grammar);
  std::string key = "choice";
  for (const std::string& c : choices) absl::StrAppend(&key, ":", c.size(), ":", c);
  return key;
}

namespace {

absl::StatusOr<Grammar> CompileContent(const ConstraintSpec& spec) {
  switch (spec.kind) {
    case ConstraintSpec::Kind::kRegex: {
      ASSIGN_OR_RETURN(Dfa dfa, CompileRegex(spec.regex));
      return SingleRuleGrammar(std::move(dfa));
    }
    case ConstraintSpec::Kind::kJsonSchema:
      return CompileJsonSchema(spec.json_schema, {.any_whitespace = spec.any_whitespace});
    case ConstraintSpec::Kind::kJsonObject:
      return JsonObjectGrammar({.any_whitespace = spec.any_whitespace});
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

}  // namespace

}  // namespace kvserve::structured
