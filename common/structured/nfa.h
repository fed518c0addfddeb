// Thompson construction over bytes, and the subset construction that turns it into a Dfa. Sets
// of Unicode code points become the UTF-8 byte sequences that encode them (surrogates excluded),
// so an automaton over bytes accepts exactly the UTF-8 encodings of the strings it stands for,
// and a token that ends inside a character is judged by the bytes it has.
//
//   Nfa nfa;
//   Nfa::Fragment f = nfa.Concat(nfa.CodePoints({{'a', 'z'}}), nfa.Star(nfa.CodePoints(digits)));
//   ASSIGN_OR_RETURN(Dfa dfa, nfa.ToDfa(f, /*max_states=*/10000));
//
// Not thread-safe while being built; ToDfa does not change it.
#ifndef KVSERVE_COMMON_STRUCTURED_NFA_H_
#define KVSERVE_COMMON_STRUCTURED_NFA_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/structured/dfa.h"

namespace kvserve::structured {

// Code points as sorted, disjoint, inclusive ranges.
using CodePointSet = std::vector<std::pair<uint32_t, uint32_t>>;

inline constexpr uint32_t kMaxCodePoint = 0x10FFFF;

// The sorted, merged form of any list of ranges.
CodePointSet Normalize(CodePointSet set);
// Every code point (surrogates aside, which UTF-8 cannot encode) not in `set`.
CodePointSet Complement(const CodePointSet& set);

// A rule's call edge out of a state: match rule `rule`, then go on from `to`.
struct CallEdge {
  int32_t rule = 0;
  int32_t to = 0;
  bool operator==(const CallEdge&) const = default;
};

// A grammar rule's automaton: bytes move as in a Dfa, calls as listed per state.
struct RuleDfa {
  Dfa dfa;
  std::vector<std::vector<CallEdge>> calls;  // [num_states]
};

template <typename States>
class Closures;

class Nfa {
 public:
  // A piece of automaton with one entry and one exit state.
  struct Fragment {
    int32_t start = 0, end = 0;
  };

  // Refused (ResourceExhausted from ToDfa) past this many states.
  explicit Nfa(int32_t max_states = 200000) : max_states_(max_states) {}

  Fragment Empty();  // the empty string
  Fragment ByteRange(uint8_t lo, uint8_t hi);
  Fragment CodePoints(const CodePointSet& set);  // one character of `set`, UTF-8 encoded
  Fragment Literal(std::string_view bytes);
  Fragment Concat(Fragment a, Fragment b);
  Fragment Alternate(Fragment a, Fragment b);
  Fragment Star(Fragment a);
  Fragment Plus(Fragment a);
  Fragment Optional(Fragment a);
  // A fragment that matches nothing (the empty set), e.g. a class with no code points.
  Fragment Nothing();
  // What rule `rule` of a grammar matches (common/structured/grammar.h): an edge the subset
  // construction keeps as a call, never expanded here.
  Fragment Call(int32_t rule);

  // For automata wired by hand: a fresh state, a byte-range move, an empty move.
  int32_t AddState() { return NewState(); }
  void AddEdge(int32_t from, uint8_t lo, uint8_t hi, int32_t to) {
    states_[from].edges.push_back({lo, hi, to});
  }
  void Link(int32_t from, int32_t to) { states_[from].epsilon.push_back(to); }

  [[nodiscard]] int32_t num_states() const { return static_cast<int32_t>(states_.size()); }
  [[nodiscard]] bool too_large() const { return num_states() > max_states_; }

  // The deterministic automaton accepting what `f` accepts, with only states that can still
  // accept. InvalidArgument when it accepts nothing; ResourceExhausted past `max_states` DFA
  // states, the NFA's own limit, or `max_work` steps of construction (edges followed and states
  // reached: a bound on the time a hostile pattern can take).
  [[nodiscard]] absl::StatusOr<Dfa> ToDfa(Fragment f, int32_t max_states,
                                          int64_t max_work = 20'000'000) const;
  // The same for a fragment with calls: per DFA state, the calls that leave it (sorted by
  // rule). A call counts as able to reach acceptance (the grammar checks its rules match).
  [[nodiscard]] absl::StatusOr<RuleDfa> ToRuleDfa(Fragment f, int32_t max_states,
                                                  int64_t max_work = 20'000'000) const;

  // ToRuleDfa for many fragments of one NFA (a grammar's rules): the byte classes and the
  // closures' marks are made once, not once per fragment.
  class Determinizer;

 private:
  struct Edge {
    uint8_t lo = 0, hi = 0;
    int32_t to = 0;
  };
  struct State {
    std::vector<Edge> edges;
    std::vector<int32_t> epsilon;
    std::vector<CallEdge> calls;  // `to` is an NFA state here
  };

  int32_t NewState();
  void AddSequence(Fragment f, const std::vector<std::pair<uint8_t, uint8_t>>& bytes);

  std::vector<State> states_;
  int32_t max_states_;
};

// `make()` (a fresh fragment each call, as absl::StatusOr<Nfa::Fragment>) at least `min` and at
// most `max` (-1: unbounded) times: x...x x* or x...x (x(x(...)?)?)?, built from the inside out.
// Stops making copies once the NFA is too large (ToDfa then refuses it).
template <typename Make>
absl::StatusOr<Nfa::Fragment> Repeat(Nfa& nfa, Make make, int64_t min, int64_t max) {
  Nfa::Fragment f = nfa.Empty();
  for (int64_t i = 0; i < min && !nfa.too_large(); ++i) {
    absl::StatusOr<Nfa::Fragment> x = make();
    if (!x.ok()) return x.status();
    f = nfa.Concat(f, *x);
  }
  if (max < 0) {
    absl::StatusOr<Nfa::Fragment> x = make();
    if (!x.ok()) return x.status();
    return nfa.Concat(f, nfa.Star(*x));
  }
  Nfa::Fragment tail = nfa.Empty();
  for (int64_t i = min; i < max && !nfa.too_large(); ++i) {
    absl::StatusOr<Nfa::Fragment> x = make();
    if (!x.ok()) return x.status();
    tail = nfa.Optional(nfa.Concat(*x, tail));
  }
  return nfa.Concat(f, tail);
}

class Nfa::Determinizer {
 public:
  explicit Determinizer(const Nfa& nfa);
  ~Determinizer();
  absl::StatusOr<RuleDfa> Run(Fragment f, int32_t max_states, int64_t max_work);
  // The construction steps all runs so far took (a grammar's budget is for all its rules).
  [[nodiscard]] int64_t total_work() const { return total_work_; }

 private:
  const Nfa& nfa_;
  int64_t total_work_ = 0;
  std::unique_ptr<Closures<std::vector<State>>> closures_;
  std::vector<std::pair<int, int>> classes_;  // [first byte, last byte]
  std::array<int, 256> class_of_{};
};

}  // namespace kvserve::structured

#endif  // KVSERVE_COMMON_STRUCTURED_NFA_H_
