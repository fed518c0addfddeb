// A Hugging Face `tokenizer.json` byte-level BPE tokenizer (Llama 3, Qwen2/2.5/3) that
// produces the same ids as the `tokenizers` library: added and special tokens, the file's
// pre-tokenizer regex (PCRE2 JIT), NFC normalization where the file asks, byte fallback, the
// post-processor's special tokens, and BOS/EOS from `tokenizer_config.json`.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok, Tokenizer::FromDirectory(model_dir));
//   ASSIGN_OR_RETURN(std::vector<int> ids, tok->Encode("Hello world"));
//   ASSIGN_OR_RETURN(std::string text, tok->Decode(ids));
//
// Files with components it does not implement (WordPiece, Unigram, Metaspace, ...) are
// rejected at load with InvalidArgument naming the component. Immutable after creation:
// Encode and Decode may run on many threads at once.
#ifndef KVSERVE_COMMON_TOKENIZER_TOKENIZER_H_
#define KVSERVE_COMMON_TOKENIZER_TOKENIZER_H_

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/string_util.h"
#include "common/tokenizer/added_vocabulary.h"
#include "common/tokenizer/bpe_model.h"
#include "common/tokenizer/regex_splitter.h"

namespace kvserve::tokenizer {

class Tokenizer {
 public:
  // Loads DIR/tokenizer.json and, when present, DIR/tokenizer_config.json.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromDirectory(const std::string& dir);
  // `config_json` may be empty (no tokenizer_config.json). `source` names the files in errors.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromJson(std::string_view tokenizer_json,
                                                             std::string_view config_json,
                                                             std::string_view source);
  ~Tokenizer();

  // InvalidArgument if `text` is not valid UTF-8 (naming the byte offset). With
  // `add_special_tokens`, adds what the post-processor (or add_bos_token) asks for.
  [[nodiscard]] absl::StatusOr<std::vector<int>> Encode(std::string_view text,
                                                        bool add_special_tokens = true) const;

  // Text of `ids` (invalid UTF-8 from partial tokens becomes U+FFFD). InvalidArgument naming
  // the first id outside the vocabulary.
  [[nodiscard]] absl::StatusOr<std::string> Decode(absl::Span<const int> ids,
                                                   bool skip_special_tokens = false) const;

  // The raw bytes a token stands for when decoded (empty for unknown ids).
  [[nodiscard]] std::string_view TokenBytes(int id) const;
  [[nodiscard]] bool IsSpecial(int id) const;
  [[nodiscard]] bool IsValidId(int id) const;
  // Token text as written in tokenizer.json (byte-level form for BPE tokens).
  [[nodiscard]] std::optional<int> TokenToId(std::string_view token) const;
  // The inverse: `id` as tokenizer.json writes it (transformers' convert_ids_to_tokens): a
  // vocabulary token in its byte-level form, an added token as its content. Empty for an id
  // outside the vocabulary.
  [[nodiscard]] std::string IdToToken(int id) const;
  // One past the largest id (vocabulary plus added tokens).
  [[nodiscard]] int vocab_size() const { return static_cast<int>(decode_.size()); }

  [[nodiscard]] std::optional<int> bos_id() const { return bos_id_; }
  [[nodiscard]] std::optional<int> eos_id() const { return eos_id_; }
  [[nodiscard]] const std::string& bos_token() const { return bos_token_; }
  [[nodiscard]] const std::string& eos_token() const { return eos_token_; }
  // The default chat template from tokenizer_config.json, "" if none.
  [[nodiscard]] const std::string& chat_template() const { return chat_template_; }

 private:
  struct DecodeEntry {
    std::string bytes;
    bool special = false;
  };
  struct PreTokenizeStep {
    std::unique_ptr<RegexSplitter> splitter;
  };

  Tokenizer() = default;
  absl::Status EncodeText(std::string_view text, std::vector<int>* out) const;
  absl::Status EncodeNormalizedPiece(std::string_view text, std::vector<int>* out) const;
  absl::Status PreTokenize(std::string_view text, size_t step, std::vector<int>* out) const;

  friend class TokenizerLoader;

  std::unique_ptr<BpeModel> bpe_;
  std::unique_ptr<AddedVocabulary> added_;
  std::vector<PreTokenizeStep> pre_tokenize_;
  bool add_prefix_space_ = false;
  bool nfc_ = false;
  std::vector<int> prefix_ids_;  // post-processor's special tokens around the sequence
  std::vector<int> suffix_ids_;
  std::vector<DecodeEntry> decode_;
  std::vector<bool> valid_;  // ids that have an entry, as bits: a 4K-id prompt is checked in cache
  StringMap<int> token_to_id_;  // file spelling -> id
  std::optional<int> bos_id_, eos_id_;
  std::string bos_token_, eos_token_;
  std::string chat_template_;
};

}  // namespace kvserve::tokenizer

#endif  // KVSERVE_COMMON_TOKENIZER_TOKENIZER_H_
