// Added tokens (special tokens such as `<|eot_id|>` and extra tokens such as `<think>`) are
// cut out of the text before normalization and BPE, as Hugging Face `tokenizers` does: the
// leftmost, then longest, match wins; `lstrip` / `rstrip` swallow neighbouring whitespace;
// `single_word` tokens match only between word boundaries.
//
//   AddedVocabulary vocab(tokens);
//   vocab.Split(text, /*normalized=*/false, [&](std::string_view text, int id) { ... });
//
// Immutable after construction; safe from many threads.
#ifndef KVSERVE_COMMON_TOKENIZER_ADDED_VOCABULARY_H_
#define KVSERVE_COMMON_TOKENIZER_ADDED_VOCABULARY_H_

#include <bitset>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"

namespace kvserve::tokenizer {

struct AddedToken {
  int id = -1;
  std::string content;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
  // Matched against the normalized text (true) or the raw text (false).
  bool normalized = false;
};

class AddedVocabulary {
 public:
  explicit AddedVocabulary(std::vector<AddedToken> tokens);

  // Splits `text` on the added tokens whose `normalized` flag equals `normalized`. Calls
  // `emit(segment, -1)` for plain text (never empty) and `emit(content, id)` for a token.
  void Split(std::string_view text, bool normalized,
             absl::FunctionRef<void(std::string_view, int)> emit) const;

  [[nodiscard]] const std::vector<AddedToken>& tokens() const { return tokens_; }
  [[nodiscard]] bool empty() const { return tokens_.empty(); }

 private:
  // Longest token of the given class starting at `pos`, or nullptr.
  const AddedToken* LongestAt(std::string_view text, size_t pos, bool normalized) const;

  std::vector<AddedToken> tokens_;
  std::bitset<256> first_bytes_[2];                  // [normalized]: bytes that can start a token
  std::vector<const AddedToken*> by_first_[2][256];  // longest first
};

}  // namespace kvserve::tokenizer

#endif  // KVSERVE_COMMON_TOKENIZER_ADDED_VOCABULARY_H_
