// Small UTF-8 helpers shared by the tokenizer and the detokenizers.
//
//   if (!IsValidUtf8(text)) return absl::InvalidArgumentError("...");
//   size_t n = CompleteUtf8Prefix(bytes);  // bytes[n..] is an unfinished sequence
//   AppendUtf8(U'\u00e9', text);             // the one UTF-8 encoder
#ifndef KVSERVE_COMMON_UTF8_H_
#define KVSERVE_COMMON_UTF8_H_

#include <cstddef>
#include <cstdint>
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

// The UTF-8 encoding of code point `c` (at most U+10FFFF) in out[0..n), n (1 to 4) returned.
// Surrogates are encoded as any other code point: callers that must not produce them exclude
// them first.
inline int EncodeUtf8(char32_t c, char out[4]) {
  const auto byte = [](uint32_t v) { return static_cast<char>(static_cast<uint8_t>(v)); };
  if (c < 0x80) {
    out[0] = byte(c);
    return 1;
  }
  if (c < 0x800) {
    out[0] = byte(0xC0 | (c >> 6));
    out[1] = byte(0x80 | (c & 0x3F));
    return 2;
  }
  if (c < 0x10000) {
    out[0] = byte(0xE0 | (c >> 12));
    out[1] = byte(0x80 | ((c >> 6) & 0x3F));
    out[2] = byte(0x80 | (c & 0x3F));
    return 3;
  }
  out[0] = byte(0xF0 | (c >> 18));
  out[1] = byte(0x80 | ((c >> 12) & 0x3F));
  out[2] = byte(0x80 | ((c >> 6) & 0x3F));
  out[3] = byte(0x80 | (c & 0x3F));
  return 4;
}

// Appends the UTF-8 encoding of `c` (as EncodeUtf8) to `out`.
inline void AppendUtf8(char32_t c, std::string& out) {
  char bytes[4];
  out.append(bytes, EncodeUtf8(c, bytes));
}

// Byte length of the well-formed sequence starting at s[i], or 0 if it is invalid there
// (including a truncated sequence at the end).
size_t Utf8SequenceLength(std::string_view s, size_t i);

}  // namespace kvserve

#endif  // KVSERVE_COMMON_UTF8_H_
