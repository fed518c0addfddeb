// Context-free constraints (JSON schemas, grammars) as a pushdown automaton over bytes: each
// rule is a RuleDfa (bytes move inside the rule, a call pushes the callee), and a matcher state
// is the set of stacks of rule positions that the bytes so far can be in. Regex and choice
// constraints are the one-rule case, so the worker runs every constraint the same way.
//
//   GrammarBuilder b;
//   const int32_t value = b.Declare("value");
//   b.Define(value, b.nfa().Alternate(b.nfa().Literal("1"),
//                                     b.nfa().Concat(b.nfa().Literal("["),
//                                     ...b.nfa().Call(value)...)));
//   ASSIGN_OR_RETURN(Grammar g, std::move(b).Build(value));
//   GrammarMatcher m(std::make_shared<const Grammar>(std::move(g)));
//   GrammarMatcher::State s = m.Walk(m.start(), "[1]");   // kDead: no sentence has this prefix
//   bool done = s != GrammarMatcher::kDead && m.accepting(s);
//
// Grammar is immutable once built (any thread). A GrammarMatcher memoizes what it has met (the
// stacks, the states and their moves), so it is not thread-safe: one thread at a time.
#ifndef KVSERVE_COMMON_STRUCTURED_GRAMMAR_H_
#define KVSERVE_COMMON_STRUCTURED_GRAMMAR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/structured/dfa.h"
#include "common/structured/nfa.h"

namespace kvserve::structured {

struct GrammarLimits {
  int32_t max_nfa_states = 400000;
  int32_t max_rule_states = 10000;    // one rule's DFA
  int32_t max_total_states = 100000;  // all rules' DFAs together
  int64_t max_work = 40'000'000;      // steps of all the rules' subset constructions together
};

struct Grammar {
  std::vector<RuleDfa> rules;
  std::vector<std::string> names;   // [rules], for messages
  std::vector<bool> has_byte_move;  // per rule state, flattened by state_base
  std::vector<int32_t> state_base;  // [rules]: where a rule's states start in has_byte_move
  int32_t root = 0;

  [[nodiscard]] bool HasByteMove(int32_t rule, Dfa::State s) const {
    return has_byte_move[state_base[rule] + s];
  }
};

// One rule, as a Grammar (what a regex or a choice list becomes).
Grammar SingleRuleGrammar(Dfa dfa);

// `g` after a prefix: the sentences are a string `prefix` accepts followed by one of g's.
Grammar PrefixedGrammar(Grammar g, const Dfa& prefix);

class GrammarBuilder {
 public:
  explicit GrammarBuilder(GrammarLimits limits = {})
      : limits_(limits), nfa_(limits.max_nfa_states) {}

  // Where rule bodies are built; Nfa::Call(id) refers to a rule declared here.
  Nfa& nfa() { return nfa_; }
  // A new rule (its body given later by Define, so that rules can call each other).
  int32_t Declare(std::string name);
  void Define(int32_t rule, Nfa::Fragment body);
  [[nodiscard]] int32_t num_rules() const { return static_cast<int32_t>(names_.size()); }

  // The grammar whose sentences are `root`'s. InvalidArgument for a rule never defined, one
  // that matches no finite string, or left recursion (a rule that can call itself before any
  // byte), naming the rule; ResourceExhausted past the limits.
  absl::StatusOr<Grammar> Build(int32_t root) &&;

 private:
  GrammarLimits limits_;
  Nfa nfa_;
  std::vector<std::string> names_;
  std::vector<Nfa::Fragment> bodies_;
  std::vector<bool> defined_;
};

class GrammarMatcher {
 public:
  using State = int32_t;
  static constexpr State kDead = -1;

  // `max_depth`: the deepest stack of rules followed (deeper nesting is treated as leaving the
  // language, so that a recursive grammar cannot grow a stack without bound).
  explicit GrammarMatcher(std::shared_ptr<const Grammar> grammar, int32_t max_depth = 64);

  [[nodiscard]] State start() const { return start_; }
  // The state after `byte` (kDead: no sentence continues this way). Inline where it was met
  // before (a table lookup: the trie walks call it for every node they visit).
  State Next(State s, uint8_t byte) {
    if (s == kDead) return kDead;
    const State known = next_[static_cast<size_t>(s) * 256 + byte];
    return known != kUnknown ? known : Step(s, byte);
  }
  State Walk(State s, std::string_view bytes);
  [[nodiscard]] bool accepting(State s) const { return configs_[s].accepting; }
  [[nodiscard]] bool has_next(State s) const { return !configs_[s].stacks.empty(); }
  [[nodiscard]] bool Matches(std::string_view bytes) {
    const State s = Walk(start_, bytes);
    return s != kDead && accepting(s);
  }
  // What the memo holds (stacks + states), a measure of its memory.
  [[nodiscard]] int64_t size() const {
    return static_cast<int64_t>(nodes_.size() + configs_.size());
  }
  [[nodiscard]] const Grammar& grammar() const { return *grammar_; }

 private:
  // One frame of a stack: a position in a rule, and the frame to return to (-1: none).
  struct Node {
    int32_t rule = 0;
    Dfa::State state = 0;
    int32_t parent = -1;
    int32_t depth = 1;
  };
  struct Config {
    std::vector<int32_t> stacks;  // sorted top nodes whose rule position has a byte move
    bool accepting = false;       // some stack has matched the whole root rule
  };

  static constexpr State kUnknown = -2;  // in next_: not met yet

  // Next's first meeting of (s, byte): the move computed and remembered.
  State Step(State s, uint8_t byte);
  int32_t InternNode(int32_t rule, Dfa::State state, int32_t parent);
  // The state reached from the top nodes `seeds` by calls and returns (no bytes).
  State Close(std::vector<int32_t> seeds);

  std::shared_ptr<const Grammar> grammar_;
  int32_t max_depth_;
  std::vector<Node> nodes_;
  absl::flat_hash_map<std::tuple<int32_t, int32_t, int32_t>, int32_t> node_ids_;
  std::vector<Config> configs_;
  absl::flat_hash_map<std::pair<std::vector<int32_t>, bool>, State> config_ids_;
  std::vector<State> next_;  // [configs × 256]: kUnknown until met
  State start_ = kDead;
};

}  // namespace kvserve::structured

#endif  // KVSERVE_COMMON_STRUCTURED_GRAMMAR_H_
