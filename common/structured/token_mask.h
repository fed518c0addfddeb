// Which tokens a constraint allows next: the vocabulary's byte strings in a trie, walked
// together with the automaton from a state, so that a prefix shared by many tokens is stepped
// once and a dead prefix prunes every token below it. A subtree whose bytes below are all plain
// text (printable ASCII but '"' and '\\') is taken whole, without visiting its nodes, when the
// automaton survives every plain string as long as the subtree is deep (free text and the
// characters of a JSON string: most of a permissive state's walk). A token is allowed when the
// automaton is still alive after all its bytes (some continuation is accepted); special tokens
// never are (EOS is the caller's: allowed exactly in accepting states).
//
//   TokenTrie trie(VocabularyBytes(tokenizer));
//   TokenMask mask = trie.Allowed(dfa, state);   // mask.Has(id)
//
// Immutable once built: any thread may call Allowed.
#ifndef KVSERVE_COMMON_STRUCTURED_TOKEN_MASK_H_
#define KVSERVE_COMMON_STRUCTURED_TOKEN_MASK_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/structured/dfa.h"
#include "common/tokenizer/tokenizer.h"

namespace kvserve::structured {

// A set of token ids as bits: word id / 32, bit id % 32 (the layout a kernel reads).
struct TokenMask {
  std::vector<uint32_t> words;

  explicit TokenMask(int32_t vocab = 0) : words((vocab + 31) / 32, 0) {}
  void Set(int32_t id) { words[id >> 5] |= 1u << (id & 31); }
  [[nodiscard]] bool Has(int32_t id) const { return (words[id >> 5] >> (id & 31)) & 1u; }
  [[nodiscard]] int32_t Count() const;
  bool operator==(const TokenMask&) const = default;
};

// Each id's bytes as decoded, empty for special tokens and ids without an entry.
std::vector<std::string> VocabularyBytes(const tokenizer::Tokenizer& tokenizer);

class TokenTrie {
 public:
  // `tokens[id]`: the bytes of token id; empty entries are never allowed.
  explicit TokenTrie(const std::vector<std::string>& tokens);

  [[nodiscard]] int32_t vocab_size() const { return vocab_size_; }
  [[nodiscard]] int32_t num_nodes() const { return static_cast<int32_t>(nodes_.size()); }
  // The ids whose bytes keep `automaton` alive from `state` (none from kDead): a Dfa or a
  // GrammarMatcher, anything with State, kDead and Next(state, byte).
  template <typename Automaton>
  [[nodiscard]] TokenMask Allowed(Automaton& automaton, typename Automaton::State state) const;

 private:
  struct Node {
    int32_t first_child = 0, num_children = 0;  // into child_bytes_ / nodes_ (children contiguous)
    int32_t first_token = 0, num_tokens = 0;    // into token_ids_: tokens that end here
    // The tokens at or below the node: a run of subtree_ids_.
    int32_t subtree_begin = 0, subtree_end = 0;
    // The longest path below the node when every byte on every path below is plain; -1 if not.
    int32_t plain_depth = 0;
  };
  // Bytes every string of text or JSON string content takes without a change of kind.
  static bool IsPlain(uint8_t b) { return b >= 0x20 && b < 0x7f && b != '"' && b != '\\'; }
  // Fills subtree_begin/end, plain_depth and subtree_ids_ (depth first).
  void IndexSubtrees();
  // How many plain bytes, at most `limit`, every plain string up to that length survives
  // from `s`: the plain bytes must all lead to one state at each step (then the strings of each
  // length reach just that state). kInfinite for a state they keep.
  template <typename Automaton>
  static int32_t PlainReach(Automaton& automaton, typename Automaton::State s, int32_t limit);
  static constexpr int32_t kInfinite = 1 << 30;

  std::vector<Node> nodes_;         // 0: the root (the empty prefix)
  std::vector<uint8_t> edge_byte_;  // per node: the byte from its parent
  std::vector<int32_t> token_ids_;
  std::vector<int32_t> subtree_ids_;
  int32_t vocab_size_ = 0;
  int32_t max_plain_depth_ = 0;
};

template <typename Automaton>
int32_t TokenTrie::PlainReach(Automaton& automaton, typename Automaton::State s, int32_t limit) {
  int32_t depth = 0;
  while (depth < limit) {
    const typename Automaton::State next = automaton.Next(s, ' ');
    if (next == Automaton::kDead) return depth;
    for (int b = 0x21; b < 0x7f; ++b) {
      if (IsPlain(static_cast<uint8_t>(b)) && automaton.Next(s, static_cast<uint8_t>(b)) != next) {
        return depth;
      }
    }
    ++depth;
    if (next == s) return kInfinite;
    s = next;
  }
  return depth;
}

// Breadth first: nodes are numbered breadth first, so the queue visits them (and their tokens)
// in the order they are stored, one pass through memory instead of a jump per node.
template <typename Automaton>
TokenMask TokenTrie::Allowed(Automaton& automaton, typename Automaton::State state) const {
  using State = typename Automaton::State;
  TokenMask mask(vocab_size_);
  if (state == Automaton::kDead) return mask;
  std::vector<std::pair<int32_t, State>> queue = {{0, state}};
  absl::flat_hash_map<State, int32_t> reach;  // PlainReach of the states met
  auto plain_reach = [&](State t) {
    auto [it, added] = reach.try_emplace(t, 0);
    if (added) it->second = PlainReach(automaton, t, max_plain_depth_);
    return it->second;
  };
  for (size_t head = 0; head < queue.size(); ++head) {
    const auto [at, s] = queue[head];
    const Node& node = nodes_[at];
    for (int32_t c = node.first_child; c < node.first_child + node.num_children; ++c) {
      const State t = automaton.Next(s, edge_byte_[c]);
      if (t == Automaton::kDead) continue;
      const Node& child = nodes_[c];
      for (int32_t k = child.first_token; k < child.first_token + child.num_tokens; ++k) {
        mask.Set(token_ids_[k]);
      }
      if (child.num_children == 0) continue;
      if (child.plain_depth >= 0 && plain_reach(t) >= child.plain_depth) {
        for (int32_t k = child.subtree_begin; k < child.subtree_end; ++k) mask.Set(subtree_ids_[k]);
      } else {
        queue.emplace_back(c, t);
      }
    }
  }
  return mask;
}

}  // namespace kvserve::structured

#endif  // KVSERVE_COMMON_STRUCTURED_TOKEN_MASK_H_
