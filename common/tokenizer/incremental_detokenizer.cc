#include "common/tokenizer/incremental_detokenizer.h"

#include "absl/strings/str_cat.h"
#include "common/utf8.h"

namespace kvserve::tokenizer {

absl::StatusOr<std::string> IncrementalDetokenizer::Append(int id) {
  if (!tokenizer_.IsValidId(id)) {
    return absl::InvalidArgumentError(absl::StrCat("token id ", id, " is not in the vocabulary"));
  }
  if (skip_special_tokens_ && tokenizer_.IsSpecial(id)) return std::string();
  std::string_view bytes = tokenizer_.TokenBytes(id);
  pending_.append(bytes.data(), bytes.size());
  size_t complete = CompleteUtf8Prefix(pending_);
  std::string out = Utf8Lossy(std::string_view(pending_).substr(0, complete));
  pending_.erase(0, complete);
  text_ += out;
  return out;
}

std::string IncrementalDetokenizer::Finish() {
  std::string out = Utf8Lossy(pending_);
  pending_.clear();
  text_ += out;
  return out;
}

}  // namespace kvserve::tokenizer
