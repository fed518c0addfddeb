// The terminals of JSON grammars over bytes: a string's characters (raw or escaped), strings
// whose decoded text matches an automaton, integer ranges and string formats as regular
// expressions. Used by json_schema.cc.
//
//   nfa.Concat(nfa.Literal("\""), JsonEscaped(CompileRegex("[a-z\"]+").value(), nfa))
//   AddRegex(IntegerRangeRegex(-5, std::nullopt), nfa)   // -5, -4, ..., 123456, ...
//
// Pure functions; any thread (an Nfa is the caller's).
#ifndef KVSERVE_COMMON_STRUCTURED_JSON_TERMINALS_H_
#define KVSERVE_COMMON_STRUCTURED_JSON_TERMINALS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "common/structured/dfa.h"
#include "common/structured/nfa.h"

namespace kvserve::structured {

// One character inside a JSON string: any code point but '"', '\' and controls, or an escape
// (\uXXXX outside the surrogates, so that every escape is one code point).
Nfa::Fragment JsonChar(Nfa& nfa);

// The JSON string bodies (between the quotes) whose decoded text `dfa` accepts: '"', '\' and
// control characters escaped, every other byte as it is.
Nfa::Fragment JsonEscaped(const Dfa& dfa, Nfa& nfa);

// A regular expression for the decimal integers in [lo, hi] (nullopt: unbounded), written
// without leading zeros or "-0". Requires lo <= hi when both are given.
std::string IntegerRangeRegex(std::optional<int64_t> lo, std::optional<int64_t> hi);

// The regular expression of a JSON Schema `format` (a subset of what the format allows: dates
// with days the month always has, times with an offset), or nullopt when not served.
std::optional<std::string> FormatRegex(std::string_view format);

}  // namespace kvserve::structured

#endif  // KVSERVE_COMMON_STRUCTURED_JSON_TERMINALS_H_
