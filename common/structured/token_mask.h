// Which tokens a constraint allows next: the vocabulary's byte strings in a trie, walked
// together with the automaton from a state, so that a prefix shared by many tokens is stepped
// once and a dead prefix prunes every token below it. A token is allowed when the automaton is
// still alive after all its bytes (some continuation is accepted); special tokens never are (EOS
// is the caller's: allowed exactly in accepting states).
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
  };
  std::vector<Node> nodes_;         // 0: the root (the empty prefix)
  std::vector<uint8_t> edge_byte_;  // per node: the byte from its parent
  std::vector<int32_t> token_ids_;
  int32_t vocab_size_ = 0;
};

template <typename Automaton>
TokenMask TokenTrie::Allowed(Automaton& automaton, typename Automaton::State state) const {
  using State = typename Automaton::State;
  TokenMask mask(vocab_size_);
  if (state == Automaton::kDead) return mask;
  std::vector<std::pair<int32_t, State>> stack = {{0, state}};
  while (!stack.empty()) {
    const auto [at, s] = stack.back();
    stack.pop_back();
    const Node& node = nodes_[at];
    for (int32_t c = node.first_child; c < node.first_child + node.num_children; ++c) {
      const State t = automaton.Next(s, edge_byte_[c]);
      if (t == Automaton::kDead) continue;
      const Node& child = nodes_[c];
      for (int32_t k = child.first_token; k < child.first_token + child.num_tokens; ++k) {
        mask.Set(token_ids_[k]);
      }
      if (child.num_children > 0) stack.emplace_back(c, t);
    }
  }
  return mask;
}

}  // namespace kvserve::structured

#endif  // KVSERVE_COMMON_STRUCTURED_TOKEN_MASK_H_
