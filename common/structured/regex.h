// Regular expressions as JSON Schema's `pattern` and structured outputs' `regex` write them
// (ECMAScript syntax), matched against the whole string, compiled to a Dfa over UTF-8 bytes.
//
// Served: literals (any Unicode), `.` (not a line terminator), classes `[...]` / `[^...]` with
// ranges and \d \w \s \D \W \S (ASCII, as ECMAScript), escapes \n \r \t \f \v \0 \xHH \uHHHH
// \u{H...} and escaped punctuation, groups `(...)`, `(?:...)`, `(?<name>...)`, alternation,
// quantifiers * + ? {n} {n,} {n,m} (lazy forms too: the same strings match), `^` at the start
// and `$` at the end. Refused with InvalidArgument naming the construct and its offset:
// backreferences, lookaround, word boundaries, anchors elsewhere, Unicode property escapes,
// inline flags.
//
//   ASSIGN_OR_RETURN(Dfa dfa, CompileRegex("[a-z]+@[a-z]+\\.com"));
//   bool ok = dfa.Matches("bob@example.com");
//
// Pure functions; any thread.
#ifndef KVSERVE_COMMON_STRUCTURED_REGEX_H_
#define KVSERVE_COMMON_STRUCTURED_REGEX_H_

#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/structured/dfa.h"
#include "common/structured/nfa.h"

namespace kvserve::structured {

struct RegexLimits {
  int32_t max_nfa_states = 200000;
  int32_t max_dfa_states = 10000;
  int32_t max_repeat = 1000;      // the largest n or m of {n,m}
  int64_t max_work = 20'000'000;  // steps of the DFA construction (Nfa::ToDfa)
};

// `pattern` as fragment of `nfa` (for automata built around it).
absl::StatusOr<Nfa::Fragment> AddRegex(std::string_view pattern, Nfa& nfa,
                                       const RegexLimits& limits = {});

// The whole-string automaton of `pattern`. ResourceExhausted when it passes the limits.
absl::StatusOr<Dfa> CompileRegex(std::string_view pattern, const RegexLimits& limits = {});

}  // namespace kvserve::structured

#endif  // KVSERVE_COMMON_STRUCTURED_REGEX_H_
