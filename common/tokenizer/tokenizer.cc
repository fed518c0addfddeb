#include "common/tokenizer/tokenizer.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/string_util.h"
#include "common/tokenizer/byte_level.h"
#include "common/utf8.h"

namespace kvserve::tokenizer {
namespace {

bool IsAscii(std::string_view s) {
  for (char c : s) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

}  // namespace

Tokenizer::~Tokenizer() = default;

absl::StatusOr<std::vector<int>> Tokenizer::Encode(std::string_view text,
                                                   bool add_special_tokens) const {
  if (size_t bad = FirstInvalidUtf8(text); bad < text.size()) {
    return absl::InvalidArgumentError(absl::StrCat("text is not valid UTF-8 at byte offset ", bad));
  }
  std::vector<int> ids;
  ids.reserve(text.size() / 3 + 4);
  if (add_special_tokens) ids.insert(ids.end(), prefix_ids_.begin(), prefix_ids_.end());
  absl::Status status;
  added_->Split(text, /*normalized=*/false, [&](std::string_view segment, int id) {
    if (!status.ok()) return;
    if (id >= 0) {
      ids.push_back(id);
    } else {
      status = EncodeText(segment, &ids);
    }
  });
  RETURN_IF_ERROR(status);
  if (add_special_tokens) ids.insert(ids.end(), suffix_ids_.begin(), suffix_ids_.end());
  return ids;
}

absl::Status Tokenizer::EncodeText(std::string_view text, std::vector<int>* out) const {
  std::string normalized;
  if (nfc_ && !IsAscii(text)) {
    normalized = Utf8Nfc(text);
    text = normalized;
  }
  absl::Status status;
  added_->Split(text, /*normalized=*/true, [&](std::string_view segment, int id) {
    if (!status.ok()) return;
    if (id >= 0) {
      out->push_back(id);
    } else {
      status = EncodeNormalizedPiece(segment, out);
    }
  });
  return status;
}

absl::Status Tokenizer::EncodeNormalizedPiece(std::string_view text, std::vector<int>* out) const {
  if (add_prefix_space_ && !text.empty() && text[0] != ' ') {
    std::string spaced = absl::StrCat(" ", Sv(text));
    return PreTokenize(spaced, 0, out);
  }
  return PreTokenize(text, 0, out);
}

absl::Status Tokenizer::PreTokenize(std::string_view text, size_t step,
                                    std::vector<int>* out) const {
  if (step == pre_tokenize_.size()) return bpe_->EncodeWord(text, out);
  absl::Status status;
  absl::Status split = pre_tokenize_[step].splitter->Split(text, [&](std::string_view piece) {
    if (status.ok()) status = PreTokenize(piece, step + 1, out);
  });
  RETURN_IF_ERROR(split);
  return status;
}

absl::StatusOr<std::string> Tokenizer::Decode(absl::Span<const int> ids,
                                              bool skip_special_tokens) const {
  std::string bytes;
  for (int id : ids) {
    if (!IsValidId(id)) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", id, " is not in the vocabulary (size ", vocab_size(), ")"));
    }
    const DecodeEntry& e = decode_[id];
    if (skip_special_tokens && e.special) continue;
    bytes += e.bytes;
  }
  return Utf8Lossy(bytes);
}

std::string_view Tokenizer::TokenBytes(int id) const {
  return IsValidId(id) ? std::string_view(decode_[id].bytes) : std::string_view();
}

bool Tokenizer::IsSpecial(int id) const { return IsValidId(id) && decode_[id].special; }

bool Tokenizer::IsValidId(int id) const {
  return id >= 0 && id < static_cast<int>(valid_.size()) && valid_[id];
}

std::string Tokenizer::IdToToken(int id) const {
  if (!IsValidId(id)) return std::string();
  std::string spelled;
  BytesToByteLevel(decode_[id].bytes, &spelled);
  // An added token is written as its content, which need not be in byte-level form.
  if (std::optional<int> back = TokenToId(spelled); back && *back == id) return spelled;
  return decode_[id].bytes;
}

std::optional<int> Tokenizer::TokenToId(std::string_view token) const {
  auto it = token_to_id_.find(token);
  if (it == token_to_id_.end()) return std::nullopt;
  return it->second;
}

}  // namespace kvserve::tokenizer
