// Grammars in GBNF, the notation of llama.cpp that xgrammar's EBNF and vLLM's guided_grammar
// also accept, compiled to a Grammar over bytes:
//
//   root   ::= object
//   object ::= "{" ws ( pair ( "," ws pair )* )? "}"     # a comment
//   pair   ::= [a-z]+ ":" ws ( "true" | "false" | [0-9]{1,3} )
//   ws     ::= [ \t\n]*
//
// A rule is `name ::= alternatives` and runs until the next `name ::=`; the sentences are
// root's. Terminals: "strings" with \n \r \t \\ \" \xHH \uHHHH \UHHHHHHHH escapes, character
// classes [...] / [^...] (ECMAScript class syntax), and `.` (any character); grouping ( ),
// alternation |, and the quantifiers * + ? {n} {n,} {n,m}. Refused with InvalidArgument naming
// the line and column: syntax errors, a rule defined twice, a missing root or rule, left
// recursion, a rule that matches no finite string.
//
//   ASSIGN_OR_RETURN(Grammar g, CompileGbnf(text));
//
// Pure functions; any thread.
#ifndef KVSERVE_COMMON_STRUCTURED_GBNF_H_
#define KVSERVE_COMMON_STRUCTURED_GBNF_H_

#include <string_view>

#include "absl/status/statusor.h"
#include "common/structured/grammar.h"

namespace kvserve::structured {

absl::StatusOr<Grammar> CompileGbnf(std::string_view text, const GrammarLimits& limits = {});

}  // namespace kvserve::structured

#endif  // KVSERVE_COMMON_STRUCTURED_GBNF_H_
