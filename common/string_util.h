// Glue between std::string_view (used throughout kvserve) and Debian's Abseil, whose
// absl::string_view is its own class (ABSL_OPTION_USE_STD_STRING_VIEW is 0 there), so
// absl::StrCat does not take a std::string_view and absl hash maps do not look one up.
//
//   absl::StrCat("field '", Sv(name), "' is bad");
//   StringMap<int> ids;  ids.find(std::string_view("abc"));
#ifndef KVSERVE_COMMON_STRING_UTIL_H_
#define KVSERVE_COMMON_STRING_UTIL_H_

#include <string>
#include <string_view>

#include "absl/container/flat_hash_map.h"
#include "absl/hash/hash.h"
#include "absl/strings/string_view.h"

namespace kvserve {

inline absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }
inline std::string_view StdSv(absl::string_view s) { return std::string_view(s.data(), s.size()); }

// Transparent hash and equality so a string-keyed map can be searched with a string_view.
struct StringViewHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return absl::Hash<absl::string_view>{}(Sv(s)); }
};
struct StringViewEq {
  using is_transparent = void;
  bool operator()(std::string_view a, std::string_view b) const { return a == b; }
};

template <typename V>
using StringMap = absl::flat_hash_map<std::string, V, StringViewHash, StringViewEq>;

}  // namespace kvserve

#endif  // KVSERVE_COMMON_STRING_UTIL_H_
