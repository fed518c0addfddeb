#include "common/tokenizer/added_vocabulary.h"

#include <algorithm>

#include "utf8proc.h"

namespace kvserve::tokenizer {
namespace {

// Decodes the code point ending just before `end` / starting at `begin`; -1 at the edges.
int32_t CodepointBefore(std::string_view s, size_t end) {
  if (end == 0) return -1;
  size_t start = end - 1;
  while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xc0) == 0x80) --start;
  utf8proc_int32_t cp = -1;
  utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + start), end - start, &cp);
  return cp;
}

int32_t CodepointAt(std::string_view s, size_t begin) {
  if (begin >= s.size()) return -1;
  utf8proc_int32_t cp = -1;
  utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + begin), s.size() - begin,
                   &cp);
  return cp;
}

bool IsWordChar(int32_t cp) {
  if (cp < 0) return false;
  if (cp == '_') return true;
  utf8proc_category_t c = utf8proc_category(cp);
  return (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO) ||
         (c >= UTF8PROC_CATEGORY_ND && c <= UTF8PROC_CATEGORY_NO) ||
         (c >= UTF8PROC_CATEGORY_MN && c <= UTF8PROC_CATEGORY_ME);
}

bool IsSpace(int32_t cp) {
  if (cp < 0) return false;
  if (cp == ' ' || (cp >= 0x09 && cp <= 0x0d) || cp == 0x85) return true;
  utf8proc_category_t c = utf8proc_category(cp);
  return c == UTF8PROC_CATEGORY_ZS || c == UTF8PROC_CATEGORY_ZL || c == UTF8PROC_CATEGORY_ZP;
}

}  // namespace

AddedVocabulary::AddedVocabulary(std::vector<AddedToken> tokens) : tokens_(std::move(tokens)) {
  for (const AddedToken& t : tokens_) {
    if (t.content.empty()) continue;
    const int n = t.normalized ? 1 : 0;
    const auto b = static_cast<unsigned char>(t.content[0]);
    first_bytes_[n].set(b);
    by_first_[n][b].push_back(&t);
  }
  for (auto& per_class : by_first_) {
    for (auto& list : per_class) {
      std::stable_sort(list.begin(), list.end(), [](const AddedToken* a, const AddedToken* b) {
        return a->content.size() > b->content.size();
      });
    }
  }
}

const AddedToken* AddedVocabulary::LongestAt(std::string_view text, size_t pos,
                                             bool normalized) const {
  const auto b = static_cast<unsigned char>(text[pos]);
  for (const AddedToken* t : by_first_[normalized ? 1 : 0][b]) {
    if (text.compare(pos, t->content.size(), t->content) != 0) continue;
    if (t->single_word && (IsWordChar(CodepointBefore(text, pos)) ||
                           IsWordChar(CodepointAt(text, pos + t->content.size())))) {
      continue;
    }
    return t;
  }
  return nullptr;
}

void AddedVocabulary::Split(std::string_view text, bool normalized,
                            absl::FunctionRef<void(std::string_view, int)> emit) const {
  const std::bitset<256>& first = first_bytes_[normalized ? 1 : 0];
  size_t segment_start = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    if (!first.test(static_cast<unsigned char>(text[pos]))) {
      ++pos;
      continue;
    }
    const AddedToken* t = LongestAt(text, pos, normalized);
    if (t == nullptr) {
      ++pos;
      continue;
    }
    size_t match_begin = pos;
    size_t match_end = pos + t->content.size();
    if (t->lstrip) {
      while (match_begin > segment_start) {
        size_t prev = match_begin - 1;
        while (prev > segment_start && (static_cast<unsigned char>(text[prev]) & 0xc0) == 0x80)
          --prev;
        if (!IsSpace(CodepointAt(text, prev))) break;
        match_begin = prev;
      }
    }
    if (t->rstrip) {
      while (match_end < text.size()) {
        int32_t cp = CodepointAt(text, match_end);
        if (!IsSpace(cp)) break;
        match_end += cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
      }
    }
    if (match_begin > segment_start)
      emit(text.substr(segment_start, match_begin - segment_start), -1);
    emit(t->content, t->id);
    segment_start = pos = match_end;
  }
  if (segment_start < text.size()) emit(text.substr(segment_start), -1);
}

}  // namespace kvserve::tokenizer
