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

// `json` re-written; InvalidArgument if it is not one JSON value. `indent` >= 0: json.dumps's
// indent (items on lines of their own, "," ending lines; Jinja's `tojson(indent=4)`).
absl::StatusOr<std::string> PythonJsonText(std::string_view json, int indent = -1);

// `text` as a JSON string (quoted, escaped as json.dumps escapes with ensure_ascii=False;
// invalid UTF-8 replaced).
std::string PythonJsonString(std::string_view text);

}  // namespace kvserve

#endif  // KVSERVE_COMMON_JSON_TEXT_H_
