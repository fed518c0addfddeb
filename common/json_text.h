// JSON written the way Python's json.dumps writes it by default with ensure_ascii=False: ", "
// between items, ": " after keys, keys in their given order, non-ASCII as it is. Chat
// templates' `tojson` writes tool definitions and tool-call arguments so, and vLLM sends tool
// calls' arguments so; matching it keeps prompts identical to the Jinja renderer's.
//
//   ASSIGN_OR_RETURN(std::string s, PythonJsonText(R"({"a":[1,2]})"));  // {"a": [1, 2]}
//
// Pure functions (JsonStringScan: one per scan); any thread.
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

// For scanners that read JSON text's structure a character at a time (nesting depth, numbers,
// where an object ends): which characters belong to a string, its quotes and escapes included.
//
//   JsonStringScan scan;
//   for (char c : text) if (!scan.InString(c) && c == '{') ++depth;
class JsonStringScan {
 public:
  // Whether `c`, the text's next character, is part of a string.
  bool InString(char c) {
    if (!in_string_) return in_string_ = c == '"';
    if (escaped_) {
      escaped_ = false;
    } else if (c == '\\') {
      escaped_ = true;
    } else if (c == '"') {
      in_string_ = false;
    }
    return true;
  }

 private:
  bool in_string_ = false, escaped_ = false;
};

}  // namespace kvserve

#endif  // KVSERVE_COMMON_JSON_TEXT_H_
