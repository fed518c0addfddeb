// Splits text with a pre-tokenizer regex the way Hugging Face's `Split` pre-tokenizer does
// with behavior `Isolated`: every match is a piece, and so is every gap between matches.
// PCRE2 with JIT, UTF and Unicode properties (\p{L}, \s, ...) stands in for Oniguruma.
//
//   ASSIGN_OR_RETURN(auto splitter, RegexSplitter::Create(pattern));
//   RETURN_IF_ERROR(splitter->Split(text, [&](std::string_view piece) { ... }));
//
// Immutable after Create; Split may run on many threads at once.
#ifndef KVSERVE_COMMON_TOKENIZER_REGEX_SPLITTER_H_
#define KVSERVE_COMMON_TOKENIZER_REGEX_SPLITTER_H_

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"

namespace kvserve::tokenizer {

class RegexSplitter {
 public:
  // InvalidArgument with PCRE2's message and offset if the pattern does not compile.
  static absl::StatusOr<std::unique_ptr<RegexSplitter>> Create(const std::string& pattern);
  ~RegexSplitter();

  // `text` must be valid UTF-8 (the caller checks). Calls `piece` for each non-empty piece in
  // order. Internal if PCRE2 fails (e.g. its JIT stack limit).
  absl::Status Split(std::string_view text, absl::FunctionRef<void(std::string_view)> piece) const;

 private:
  RegexSplitter() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvserve::tokenizer

#endif  // KVSERVE_COMMON_TOKENIZER_REGEX_SPLITTER_H_
