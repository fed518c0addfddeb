// A deterministic automaton over bytes, the form every constraint of structured outputs
// (regex, choice, and the regular parts of JSON schemas) is compiled to before decoding: a
// 256-way transition table per state, with every state that cannot reach an accepting one
// removed, so that "not dead" means "some continuation is accepted".
//
//   Dfa::State s = dfa.start();
//   s = dfa.Walk(s, token_bytes);      // kDead: no string with this prefix is accepted
//   bool eos_ok = s != Dfa::kDead && dfa.accepting(s);
//
// Immutable once built: any thread may read it.
#ifndef KVSERVE_COMMON_STRUCTURED_DFA_H_
#define KVSERVE_COMMON_STRUCTURED_DFA_H_

#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

namespace kvserve::structured {

class Dfa {
 public:
  using State = int32_t;
  static constexpr State kDead = -1;

  // `next`: [num_states × 256] targets (kDead or a state), `accepting`: [num_states]. Every
  // state must reach an accepting one (what DfaBuilder guarantees).
  Dfa(std::vector<State> next, std::vector<bool> accepting, State start)
      : next_(std::move(next)), accepting_(std::move(accepting)), start_(start) {}

  [[nodiscard]] State start() const { return start_; }
  [[nodiscard]] int32_t num_states() const { return static_cast<int32_t>(accepting_.size()); }
  [[nodiscard]] bool accepting(State s) const { return accepting_[s]; }
  [[nodiscard]] State Next(State s, uint8_t byte) const { return next_[s * 256 + byte]; }
  // The state after `bytes` from `s` (kDead stays kDead).
  [[nodiscard]] State Walk(State s, std::string_view bytes) const {
    for (char c : bytes) {
      if (s == kDead) return kDead;
      s = Next(s, static_cast<uint8_t>(c));
    }
    return s;
  }
  [[nodiscard]] bool Matches(std::string_view bytes) const {
    const State s = Walk(start_, bytes);
    return s != kDead && accepting(s);
  }

 private:
  std::vector<State> next_;
  std::vector<bool> accepting_;
  State start_ = 0;
};

}  // namespace kvserve::structured

#endif  // KVSERVE_COMMON_STRUCTURED_DFA_H_
