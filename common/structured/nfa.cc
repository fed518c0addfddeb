#include "common/structured/nfa.h"

#include <algorithm>
#include <array>
#include <deque>
#include <map>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/utf8.h"

namespace kvserve::structured {
namespace {

using ByteSequence = std::vector<std::pair<uint8_t, uint8_t>>;

constexpr uint32_t kSurrogateLo = 0xD800, kSurrogateHi = 0xDFFF;

// Appends byte-range sequences that encode exactly the code points [lo, hi] (no surrogates):
// split where the encoded length changes, then where a continuation byte's range would not be
// whole, until each piece is a product of per-byte ranges.
void SplitUtf8(uint32_t lo, uint32_t hi, std::vector<ByteSequence>& out) {
  for (uint32_t max : {0x7Fu, 0x7FFu, 0xFFFFu}) {
    if (lo <= max && hi > max) {
      SplitUtf8(lo, max, out);
      SplitUtf8(max + 1, hi, out);
      return;
    }
  }
  for (int i = 1; i < 4 && hi >= 0x80; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) == (hi & ~m)) continue;
    if ((lo & m) != 0) {
      SplitUtf8(lo, lo | m, out);
      SplitUtf8((lo | m) + 1, hi, out);
      return;
    }
    if ((hi & m) != m) {
      SplitUtf8(lo, (hi & ~m) - 1, out);
      SplitUtf8(hi & ~m, hi, out);
      return;
    }
  }
  std::array<char, 4> a{}, b{};
  const int n = EncodeUtf8(lo, a.data());
  EncodeUtf8(hi, b.data());
  ByteSequence seq;
  for (int k = 0; k < n; ++k) {
    seq.emplace_back(static_cast<uint8_t>(a[k]), static_cast<uint8_t>(b[k]));
  }
  out.push_back(std::move(seq));
}

}  // namespace

// Epsilon closures of NFA state sets, with marks reused across calls (one pass over what is
// reached, not over the whole NFA).
template <typename States>
class Closures {
 public:
  explicit Closures(const States& states) : states_(states), mark_(states.size(), 0) {}

  // The states reachable from `set` by epsilon moves, sorted, without repeats.
  std::vector<int32_t> Of(const std::vector<int32_t>& set) {
    ++generation_;
    std::vector<int32_t> out, stack;
    for (int32_t s : set) Visit(s, out, stack);
    while (!stack.empty()) {
      const int32_t s = stack.back();
      stack.pop_back();
      for (int32_t t : states_[s].epsilon) Visit(t, out, stack);
    }
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  void Visit(int32_t s, std::vector<int32_t>& out, std::vector<int32_t>& stack) {
    if (mark_[s] == generation_) return;
    mark_[s] = generation_;
    out.push_back(s);
    stack.push_back(s);
  }

  const States& states_;
  std::vector<uint32_t> mark_;
  uint32_t generation_ = 0;
};

namespace {

// Keeps the states that can reach an accepting one (a call counts as a way there), renumbered;
// InvalidArgument if the start cannot.
absl::StatusOr<RuleDfa> Prune(const std::vector<Dfa::State>& next,
                              const std::vector<bool>& accepting,
                              const std::vector<std::vector<CallEdge>>& calls) {
  const auto n = static_cast<int32_t>(accepting.size());
  std::vector<std::vector<int32_t>> from(n);
  for (int32_t s = 0; s < n; ++s) {
    for (int b = 0; b < 256; ++b) {
      if (const Dfa::State t = next[s * 256 + b]; t != Dfa::kDead) from[t].push_back(s);
    }
    for (const CallEdge& c : calls[s]) from[c.to].push_back(s);
  }
  std::vector<bool> live(accepting);
  std::vector<int32_t> stack;
  for (int32_t s = 0; s < n; ++s) {
    if (live[s]) stack.push_back(s);
  }
  while (!stack.empty()) {
    const int32_t s = stack.back();
    stack.pop_back();
    for (int32_t p : from[s]) {
      if (!live[p]) live[p] = true, stack.push_back(p);
    }
  }
  if (!live[0]) return absl::InvalidArgumentError("the pattern matches no string");
  std::vector<Dfa::State> id(n, Dfa::kDead);
  Dfa::State count = 0;
  for (int32_t s = 0; s < n; ++s) {
    if (live[s]) id[s] = count++;
  }
  std::vector<Dfa::State> pruned(static_cast<size_t>(count) * 256, Dfa::kDead);
  std::vector<bool> pruned_accepting(count);
  std::vector<std::vector<CallEdge>> pruned_calls(count);
  for (int32_t s = 0; s < n; ++s) {
    if (id[s] == Dfa::kDead) continue;
    pruned_accepting[id[s]] = accepting[s];
    for (int b = 0; b < 256; ++b) {
      if (const Dfa::State t = next[s * 256 + b]; t != Dfa::kDead) pruned[id[s] * 256 + b] = id[t];
    }
    for (const CallEdge& c : calls[s]) {
      if (id[c.to] != Dfa::kDead) pruned_calls[id[s]].push_back({c.rule, id[c.to]});
    }
  }
  return RuleDfa{Dfa(std::move(pruned), std::move(pruned_accepting), 0), std::move(pruned_calls)};
}

}  // namespace

CodePointSet Normalize(CodePointSet set) {
  std::sort(set.begin(), set.end());
  CodePointSet out;
  for (const auto& [lo, hi] : set) {
    if (lo > hi) continue;
    if (!out.empty() && lo <= out.back().second + 1) {
      out.back().second = std::max(out.back().second, hi);
    } else {
      out.emplace_back(lo, hi);
    }
  }
  return out;
}

CodePointSet Complement(const CodePointSet& set) {
  CodePointSet out;
  uint32_t next = 0;
  for (const auto& [lo, hi] : Normalize(set)) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= kMaxCodePoint) out.emplace_back(next, kMaxCodePoint);
  return out;
}

int32_t Nfa::NewState() {
  states_.emplace_back();
  return static_cast<int32_t>(states_.size()) - 1;
}

Nfa::Fragment Nfa::Empty() {
  const int32_t s = NewState();
  return {s, s};
}

Nfa::Fragment Nfa::Nothing() { return {NewState(), NewState()}; }

Nfa::Fragment Nfa::ByteRange(uint8_t lo, uint8_t hi) {
  Fragment f{NewState(), NewState()};
  states_[f.start].edges.push_back({lo, hi, f.end});
  return f;
}

void Nfa::AddSequence(Fragment f, const ByteSequence& bytes) {
  int32_t at = f.start;
  for (size_t k = 0; k < bytes.size(); ++k) {
    const int32_t to = k + 1 == bytes.size() ? f.end : NewState();
    states_[at].edges.push_back({bytes[k].first, bytes[k].second, to});
    at = to;
  }
}

Nfa::Fragment Nfa::CodePoints(const CodePointSet& set) {
  Fragment f{NewState(), NewState()};
  std::vector<ByteSequence> sequences;
  for (auto [lo, hi] : Normalize(set)) {
    hi = std::min(hi, kMaxCodePoint);
    // UTF-8 has no encoding for surrogates: the parts on either side.
    if (lo < kSurrogateLo && hi >= kSurrogateLo) {
      SplitUtf8(lo, kSurrogateLo - 1, sequences);
      lo = kSurrogateHi + 1;
    } else if (lo >= kSurrogateLo && lo <= kSurrogateHi) {
      lo = kSurrogateHi + 1;
    }
    if (lo <= hi) SplitUtf8(lo, hi, sequences);
  }
  for (const ByteSequence& seq : sequences) AddSequence(f, seq);
  return f;
}

Nfa::Fragment Nfa::Literal(std::string_view bytes) {
  Fragment f = Empty();
  for (char c : bytes) {
    const auto b = static_cast<uint8_t>(c);
    f = Concat(f, ByteRange(b, b));
  }
  return f;
}

Nfa::Fragment Nfa::Concat(Fragment a, Fragment b) {
  states_[a.end].epsilon.push_back(b.start);
  return {a.start, b.end};
}

Nfa::Fragment Nfa::Alternate(Fragment a, Fragment b) {
  Fragment f{NewState(), NewState()};
  states_[f.start].epsilon = {a.start, b.start};
  states_[a.end].epsilon.push_back(f.end);
  states_[b.end].epsilon.push_back(f.end);
  return f;
}

Nfa::Fragment Nfa::Star(Fragment a) {
  Fragment f{NewState(), NewState()};
  states_[f.start].epsilon = {a.start, f.end};
  states_[a.end].epsilon.push_back(a.start);
  states_[a.end].epsilon.push_back(f.end);
  return f;
}

Nfa::Fragment Nfa::Plus(Fragment a) {
  Fragment f{NewState(), NewState()};
  states_[f.start].epsilon = {a.start};
  states_[a.end].epsilon.push_back(a.start);
  states_[a.end].epsilon.push_back(f.end);
  return f;
}

Nfa::Fragment Nfa::Call(int32_t rule) {
  Fragment f{NewState(), NewState()};
  states_[f.start].calls.push_back({rule, f.end});
  return f;
}

Nfa::Fragment Nfa::Optional(Fragment a) {
  Fragment f{NewState(), NewState()};
  states_[f.start].epsilon = {a.start, f.end};
  states_[a.end].epsilon.push_back(f.end);
  return f;
}

absl::StatusOr<Dfa> Nfa::ToDfa(Fragment f, int32_t max_states, int64_t max_work) const {
  ASSIGN_OR_RETURN(RuleDfa r, ToRuleDfa(f, max_states, max_work));
  for (const auto& calls : r.calls) {
    if (!calls.empty()) return absl::InternalError("ToDfa: the fragment has calls");
  }
  return std::move(r.dfa);
}

absl::StatusOr<RuleDfa> Nfa::ToRuleDfa(Fragment f, int32_t max_states, int64_t max_work) const {
  return Determinizer(*this).Run(f, max_states, max_work);
}

Nfa::Determinizer::Determinizer(const Nfa& nfa)
    : nfa_(nfa), closures_(std::make_unique<Closures<std::vector<State>>>(nfa.states_)) {
  // Bytes that no edge tells apart share a class: one move per class instead of per byte.
  std::array<bool, 257> boundary{};
  boundary[0] = boundary[256] = true;
  for (const State& s : nfa.states_) {
    for (const Edge& e : s.edges) boundary[e.lo] = boundary[e.hi + 1] = true;
  }
  for (int b = 0; b < 256; ++b) {
    if (boundary[b]) classes_.emplace_back(b, b);
    classes_.back().second = b;
    class_of_[b] = static_cast<int>(classes_.size()) - 1;
  }
}

Nfa::Determinizer::~Determinizer() = default;

absl::StatusOr<RuleDfa> Nfa::Determinizer::Run(Fragment f, int32_t max_states, int64_t max_work) {
  if (nfa_.too_large()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the pattern is too large: its automaton passes ", nfa_.max_states_, " states"));
  }
  const std::vector<State>& states = nfa_.states_;
  absl::flat_hash_map<std::vector<int32_t>, Dfa::State> ids;
  std::deque<std::vector<int32_t>> sets;
  std::vector<Dfa::State> next;
  std::vector<bool> accepting;
  std::vector<std::vector<CallEdge>> calls;
  auto intern = [&](std::vector<int32_t> set) -> Dfa::State {
    auto [it, added] = ids.try_emplace(set, static_cast<Dfa::State>(sets.size()));
    if (added) {
      accepting.push_back(std::binary_search(set.begin(), set.end(), f.end));
      calls.emplace_back();
      next.resize(next.size() + 256, Dfa::kDead);
      sets.push_back(std::move(set));
    }
    return it->second;
  };
  intern(closures_->Of({f.start}));
  std::vector<std::vector<int32_t>> moved(classes_.size());
  int64_t work = 0;  // edges followed and states reached: what building costs
  for (size_t d = 0; d < sets.size(); ++d) {
    if (static_cast<int32_t>(sets.size()) > max_states) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the pattern is too large: its deterministic automaton passes ", max_states, " states"));
    }
    for (int32_t s : sets[d]) {
      for (const Edge& e : states[s].edges) {
        for (int c = class_of_[e.lo]; c <= class_of_[e.hi]; ++c) moved[c].push_back(e.to);
        work += class_of_[e.hi] - class_of_[e.lo] + 1;
      }
    }
    for (size_t c = 0; c < classes_.size(); ++c) {
      if (moved[c].empty()) continue;
      std::vector<int32_t> target = closures_->Of(moved[c]);
      work += static_cast<int64_t>(target.size());
      moved[c].clear();
      const Dfa::State t = intern(std::move(target));
      for (int b = classes_[c].first; b <= classes_[c].second; ++b) next[d * 256 + b] = t;
    }
    std::map<int32_t, std::vector<int32_t>> called;  // rule -> NFA states after the call
    for (int32_t s : sets[d]) {
      for (const CallEdge& c : states[s].calls) called[c.rule].push_back(c.to);
    }
    for (auto& [rule, after] : called) {
      std::vector<int32_t> target = closures_->Of(after);
      work += static_cast<int64_t>(target.size());
      const Dfa::State t = intern(std::move(target));
      calls[d].push_back({rule, t});
    }
    if (work > max_work) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the pattern is too complex: building its automaton passes ", max_work, " steps"));
    }
  }
  total_work_ += work;
  return Prune(next, accepting, calls);
}

}  // namespace kvserve::structured
