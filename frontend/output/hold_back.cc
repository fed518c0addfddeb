#include "frontend/output/hold_back.h"

#include <algorithm>

namespace kvserve::frontend {

size_t PartialMatchLength(std::string_view text, std::string_view pattern) {
  if (pattern.empty()) return 0;
  for (size_t k = std::min(text.size(), pattern.size() - 1); k > 0; --k) {
    if (text.substr(text.size() - k) == pattern.substr(0, k)) return k;
  }
  return 0;
}

size_t HoldBackLength(std::string_view text, const std::vector<std::string>& patterns) {
  size_t hold = 0;
  for (const std::string& p : patterns) hold = std::max(hold, PartialMatchLength(text, p));
  return hold;
}

}  // namespace kvserve::frontend
