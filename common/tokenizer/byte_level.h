// GPT-2's byte-level alphabet: every byte maps to one printable Unicode character, so BPE
// vocabularies can be stored as text. Llama 3 and Qwen tokenizer.json files use it.
//
//   std::string raw;
//   if (ByteLevelToBytes("Ġhello", &raw)) { /* raw == " hello" */ }
#ifndef KVSERVE_COMMON_TOKENIZER_BYTE_LEVEL_H_
#define KVSERVE_COMMON_TOKENIZER_BYTE_LEVEL_H_

#include <cstdint>
#include <string>
#include <string_view>

namespace kvserve::tokenizer {

// Appends the byte-level text (UTF-8) of raw bytes.
void BytesToByteLevel(std::string_view bytes, std::string* out);

// Maps a byte-level string back to raw bytes. Returns false (leaving `out` unspecified) if a
// character is outside the alphabet or the string is not valid UTF-8.
bool ByteLevelToBytes(std::string_view text, std::string* out);

}  // namespace kvserve::tokenizer

#endif  // KVSERVE_COMMON_TOKENIZER_BYTE_LEVEL_H_
