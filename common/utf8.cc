#include "common/utf8.h"

#include <cstdlib>

#include "utf8proc.h"

namespace kvserve {
namespace {

// The valid range of the second byte after lead byte `b` (Unicode Table 3-7).
bool SecondByteOk(unsigned char lead, unsigned char b) {
  if (lead == 0xe0) return b >= 0xa0 && b <= 0xbf;
  if (lead == 0xed) return b >= 0x80 && b <= 0x9f;
  if (lead == 0xf0) return b >= 0x90 && b <= 0xbf;
  if (lead == 0xf4) return b >= 0x80 && b <= 0x8f;
  return b >= 0x80 && b <= 0xbf;
}

// Expected length from the lead byte, 0 if it cannot start a sequence.
size_t LeadLength(unsigned char c) {
  if (c < 0x80) return 1;
  if (c >= 0xc2 && c <= 0xdf) return 2;
  if (c >= 0xe0 && c <= 0xef) return 3;
  if (c >= 0xf0 && c <= 0xf4) return 4;
  return 0;
}

// Number of bytes starting at i that form a valid (possibly unfinished) prefix of a sequence.
size_t ValidPrefixLength(std::string_view s, size_t i, size_t need) {
  size_t k = 1;
  const auto lead = static_cast<unsigned char>(s[i]);
  for (; k < need && i + k < s.size(); ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    bool ok = k == 1 ? SecondByteOk(lead, b) : (b >= 0x80 && b <= 0xbf);
    if (!ok) break;
  }
  return k;
}

}  // namespace

size_t Utf8SequenceLength(std::string_view s, size_t i) {
  size_t need = LeadLength(static_cast<unsigned char>(s[i]));
  if (need <= 1) return need;
  return ValidPrefixLength(s, i, need) == need ? need : 0;
}

size_t FirstInvalidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    size_t n = Utf8SequenceLength(s, i);
    if (n == 0) return i;
    i += n;
  }
  return s.size();
}

size_t CompleteUtf8Prefix(std::string_view s) {
  // Look at most 3 bytes back for the start of an unfinished sequence.
  size_t start = s.size() >= 3 ? s.size() - 3 : 0;
  for (size_t i = s.size(); i-- > start;) {
    const auto c = static_cast<unsigned char>(s[i]);
    if ((c & 0xc0) == 0x80) continue;  // continuation byte: keep looking for the lead
    size_t need = LeadLength(c);
    if (need <= 1) return s.size();
    size_t have = s.size() - i;
    if (have >= need) return s.size();
    // Unfinished only if what is there is a valid prefix of a sequence.
    return ValidPrefixLength(s, i, need) == have ? i : s.size();
  }
  return s.size();
}

std::string Utf8Lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      out.push_back(s[i++]);
      continue;
    }
    size_t need = LeadLength(c);
    if (need == 0) {
      out += "\xEF\xBF\xBD";
      ++i;
      continue;
    }
    size_t have = ValidPrefixLength(s, i, need);
    if (have == need) {
      out.append(s.substr(i, need));
    } else {
      out += "\xEF\xBF\xBD";  // a maximal invalid subsequence
    }
    i += have;
  }
  return out;
}

std::string Utf8Nfc(std::string_view s) {
  utf8proc_uint8_t* out = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(
      reinterpret_cast<const utf8proc_uint8_t*>(s.data()), static_cast<utf8proc_ssize_t>(s.size()),
      &out, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) return std::string(s);  // ill-formed input: left as it is
  std::string result(reinterpret_cast<char*>(out), static_cast<size_t>(n));
  std::free(out);
  return result;
}

}  // namespace kvserve
