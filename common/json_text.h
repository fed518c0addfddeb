// JSON written the way Python's json.dumps writes it by default with ensure_ascii=False: ", "
// between items, ": " after keys, keys in their given order, non-ASCII as it is. Chat
// templates' `tojson` writes tool definitions and tool-call arguments so, and vLLM sends tool
// calls' arguments so; matching it keeps prompts identical to the Jinja renderer's.
//
//   ASSIGN_OR_RETURN(std::string s, PythonJsonText(R"({"a":[1,2]})"));  // {"a": [1, 2]}
//
// Pure functions; any thread.
#ifndef KVSERVE_COMMON_JSON_TEXT_H_
#define KVSERVE_COMMON_JSON_TEXT_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace kvserve {

// `json` re-written; InvalidArgument if it is not one JSON value.
absl::StatusOr<std::string> PythonJsonText(std::string_view json);

}  // namespace kvserve

#endif  // KVSERVE_COMMON_JSON_TEXT_H_
