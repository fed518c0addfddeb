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

#include <cstdint>
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
  Fragment Optional(Fragment a);
  // A fragment that matches nothing (the empty set), e.g. a class with no code points.
  Fragment Nothing();

  [[nodiscard]] int32_t num_states() const { return static_cast<int32_t>(states_.size()); }
  [[nodiscard]] bool too_large() const { return num_states() > max_states_; }

  // The deterministic automaton accepting what `f` accepts, with only states that can still
  // accept. InvalidArgument when it accepts nothing; ResourceExhausted past `max_states` DFA
  // states, the NFA's own limit, or `max_work` steps of construction (edges followed and states
  // reached: a bound on the time a hostile pattern can take).
  [[nodiscard]] absl::StatusOr<Dfa> ToDfa(Fragment f, int32_t max_states,
                                          int64_t max_work = 20'000'000) const;

 private:
  struct Edge {
    uint8_t lo = 0, hi = 0;
    int32_t to = 0;
  };
  struct State {
    std::vector<Edge> edges;
    std::vector<int32_t> epsilon;
  };

  int32_t NewState();
  void AddSequence(Fragment f, const std::vector<std::pair<uint8_t, uint8_t>>& bytes);

  std::vector<State> states_;
  int32_t max_states_;
};

}  // namespace kvserve::structured

#endif  // KVSERVE_COMMON_STRUCTURED_NFA_H_
