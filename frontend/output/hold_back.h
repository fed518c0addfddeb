// What a streaming text matcher holds back: the end of the text that the next delta may turn
// into a pattern it looks for (a stop string, a reasoning tag, a tool-call tag). The stop-string
// matcher, the reasoning splitter and the tool-call parser all emit text up to that point.
//
//   const size_t keep = HoldBackLength(pending, stops);   // pending[size - keep..] waits
//   emit(pending.substr(0, pending.size() - keep));
#ifndef KVSERVE_FRONTEND_OUTPUT_HOLD_BACK_H_
#define KVSERVE_FRONTEND_OUTPUT_HOLD_BACK_H_

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace kvserve::frontend {

// The length of the longest suffix of `text` that is a proper prefix of `pattern` (0 for an
// empty pattern).
size_t PartialMatchLength(std::string_view text, std::string_view pattern);

// The longest PartialMatchLength of `text` over `patterns`.
size_t HoldBackLength(std::string_view text, const std::vector<std::string>& patterns);

}  // namespace kvserve::frontend

#endif  // KVSERVE_FRONTEND_OUTPUT_HOLD_BACK_H_
