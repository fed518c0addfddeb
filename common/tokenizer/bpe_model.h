// Byte-level BPE: turns one pre-tokenized word (raw bytes) into token ids by applying merges
// in rank order, exactly as Hugging Face `tokenizers` does (lowest rank first, leftmost among
// equal ranks). Vocabulary and merges are keyed by raw bytes, so no byte-level text is built
// at encode time.
//
//   ASSIGN_OR_RETURN(auto bpe, BpeModel::Create(std::move(vocab), merges, options));
//   std::vector<int> ids;
//   bpe->EncodeWord(" hello", &ids);
//
// Immutable after Create: EncodeWord may run on many threads at once.
#ifndef KVSERVE_COMMON_TOKENIZER_BPE_MODEL_H_
#define KVSERVE_COMMON_TOKENIZER_BPE_MODEL_H_

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/string_util.h"

namespace kvserve::tokenizer {

struct BpeOptions {
  // Emit a word that is itself in the vocabulary as one token without merging (Llama 3).
  bool ignore_merges = false;
  // A byte with no token of its own becomes `<0xHH>` tokens.
  bool byte_fallback = false;
  // Token for bytes that have neither a token nor a byte-fallback token.
  std::optional<int> unk_id;
};

class BpeModel {
 public:
  // `vocab`: raw-byte token -> id. `merges`: pairs of raw-byte tokens in rank order; both
  // sides and their concatenation must be in the vocabulary (InvalidArgument otherwise,
  // naming the merge).
  static absl::StatusOr<std::unique_ptr<BpeModel>> Create(
      StringMap<int> vocab, const std::vector<std::pair<std::string, std::string>>& merges,
      const BpeOptions& options);

  // Appends the ids of one word. InvalidArgument if a byte cannot be represented (no token,
  // no byte fallback, no unk token).
  absl::Status EncodeWord(std::string_view word, std::vector<int>* out) const;

  // The same result by a different algorithm (heap + linked list, O(n log n)); EncodeWord
  // picks it for long words. Public so tests can check that both agree.
  void MergeWithHeap(std::vector<int>* symbols) const;
  void MergeWithScan(std::vector<int>* symbols) const;

 private:
  struct Merge {
    int rank;
    int new_id;
  };

  BpeModel() = default;
  static uint64_t PairKey(int a, int b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  const Merge* FindMerge(int a, int b) const {
    auto it = merges_.find(PairKey(a, b));
    return it == merges_.end() ? nullptr : &it->second;
  }
  absl::Status AppendInitialSymbols(std::string_view word, std::vector<int>* symbols) const;

  StringMap<int> vocab_;
  absl::flat_hash_map<uint64_t, Merge> merges_;
  std::array<int, 256> byte_ids_{};      // -1 when the byte has no token
  std::array<int, 256> fallback_ids_{};  // id of "<0xHH>", -1 when absent
  BpeOptions options_;
};

}  // namespace kvserve::tokenizer

#endif  // KVSERVE_COMMON_TOKENIZER_BPE_MODEL_H_
