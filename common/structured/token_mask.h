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
  // The ids whose bytes keep `dfa` alive from `state` (none from Dfa::kDead).
  [[nodiscard]] TokenMask Allowed(const Dfa& dfa, Dfa::State state) const;

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

}  // namespace kvserve::structured

#endif  // KVSERVE_COMMON_STRUCTURED_TOKEN_MASK_H_
