// Streams text out of generated token ids without ever emitting a broken UTF-8 sequence:
// bytes of a character split across tokens are held back until the character is complete.
// The concatenation of every Append() result and Finish() equals Tokenizer::Decode of all
// the ids (with the same skip_special_tokens).
//
//   IncrementalDetokenizer detok(*tokenizer, /*skip_special_tokens=*/true);
//   for (int id : new_ids) { ASSIGN_OR_RETURN(std::string delta, detok.Append(id)); send(delta); }
//   send(detok.Finish());
//
// One instance per output stream; not thread-safe (one request's thread owns it).
#ifndef KVSERVE_COMMON_TOKENIZER_INCREMENTAL_DETOKENIZER_H_
#define KVSERVE_COMMON_TOKENIZER_INCREMENTAL_DETOKENIZER_H_

#include <string>

#include "absl/status/statusor.h"
#include "common/tokenizer/tokenizer.h"

namespace kvserve::tokenizer {

class IncrementalDetokenizer {
 public:
  // `tokenizer` must outlive this object.
  IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens)
      : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens) {}

  // Adds one token and returns the text that is now final (possibly empty). InvalidArgument
  // for an id outside the vocabulary (the stream is unchanged).
  absl::StatusOr<std::string> Append(int id);

  // Ends the stream: held-back bytes that never completed a character become U+FFFD.
  std::string Finish();

  // Everything emitted so far.
  [[nodiscard]] const std::string& text() const { return text_; }

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_tokens_;
  std::string pending_;  // an unfinished UTF-8 sequence (at most 3 bytes)
  std::string text_;
};

}  // namespace kvserve::tokenizer

#endif  // KVSERVE_COMMON_TOKENIZER_INCREMENTAL_DETOKENIZER_H_
