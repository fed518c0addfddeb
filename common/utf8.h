// Small UTF-8 helpers shared by the tokenizer and the detokenizers.
//
//   if (!IsValidUtf8(text)) return absl::InvalidArgumentError("...");
//   size_t n = CompleteUtf8Prefix(bytes);  // bytes[n..] is an unfinished sequence
#ifndef KVSERVE_COMMON_UTF8_H_
#define KVSERVE_COMMON_UTF8_H_

#include <cstddef>
#include <string>
#include <string_view>

namespace kvserve {

// Byte offset of the first ill-formed sequence (overlong, surrogate, past U+10FFFF,
// truncated), or s.size() when `s` is well-formed UTF-8.
size_t FirstInvalidUtf8(std::string_view s);
inline bool IsValidUtf8(std::string_view s) { return FirstInvalidUtf8(s) == s.size(); }

// Length of the longest prefix of `s` that does not end inside a multi-byte sequence which
// could still be completed by more bytes. Invalid bytes count as complete (they will be
// replaced), so only a true unfinished tail is held back. Never more than 3 bytes are held.
size_t CompleteUtf8Prefix(std::string_view s);

// Like Python's bytes.decode('utf-8', errors='replace') and Rust's from_utf8_lossy: each
// maximal invalid subsequence becomes U+FFFD.
std::string Utf8Lossy(std::string_view s);

// Unicode NFC (canonical composition) of valid UTF-8, through utf8proc.
std::string Utf8Nfc(std::string_view s);

// Byte length of the well-formed sequence starting at s[i], or 0 if it is invalid there
// (including a truncated sequence at the end).
size_t Utf8SequenceLength(std::string_view s, size_t i);

}  // namespace kvserve

#endif  // KVSERVE_COMMON_UTF8_H_
