#include "common/tokenizer/byte_level.h"

#include <array>

#include "common/utf8.h"

namespace kvserve::tokenizer {
namespace {

struct Tables {
  std::array<uint32_t, 256> to_cp{};
  std::array<int16_t, 324> from_cp{};  // code points 0..323 cover the whole alphabet
};

const Tables& GetTables() {
  static const Tables tables = [] {
    Tables t;
    t.from_cp.fill(-1);
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      t.to_cp[b] = printable ? b : next++;
      t.from_cp[t.to_cp[b]] = static_cast<int16_t>(b);
    }
    return t;
  }();
  return tables;
}

}  // namespace

void BytesToByteLevel(std::string_view bytes, std::string* out) {
  const Tables& t = GetTables();
  for (char c : bytes) AppendUtf8(t.to_cp[static_cast<uint8_t>(c)], *out);
}

bool ByteLevelToBytes(std::string_view text, std::string* out) {
  const Tables& t = GetTables();
  size_t i = 0;
  while (i < text.size()) {
    const auto c = static_cast<uint8_t>(text[i]);
    uint32_t cp;
    if (c < 0x80) {
      cp = c;
      i += 1;
    } else if ((c & 0xe0) == 0xc0 && i + 1 < text.size() && Utf8SequenceLength(text, i) == 2) {
      cp = ((c & 0x1f) << 6) | (static_cast<uint8_t>(text[i + 1]) & 0x3f);
      i += 2;
    } else {
      return false;
    }
    if (cp >= t.from_cp.size() || t.from_cp[cp] < 0) return false;
    out->push_back(static_cast<char>(t.from_cp[cp]));
  }
  return true;
}

}  // namespace kvserve::tokenizer
