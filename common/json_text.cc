#include "common/json_text.h"

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace kvserve {
namespace {

using Json = nlohmann::ordered_json;

constexpr int kMaxDepth = 512;  // Python's own json.dumps stops near 1000

// False past kMaxDepth.
bool Write(const Json& j, int depth, std::string& out) {
  if (depth > kMaxDepth) return false;
  if (j.is_object()) {
    out += '{';
    const char* sep = "";
    for (const auto& [key, value] : j.items()) {
      out += sep;
      out += Json(key).dump(-1, ' ', false, Json::error_handler_t::replace);
      out += ": ";
      if (!Write(value, depth + 1, out)) return false;
      sep = ", ";
    }
    out += '}';
  } else if (j.is_array()) {
    out += '[';
    const char* sep = "";
    for (const Json& value : j) {
      out += sep;
      if (!Write(value, depth + 1, out)) return false;
      sep = ", ";
    }
    out += ']';
  } else {
    out += j.dump(-1, ' ', false, Json::error_handler_t::replace);
  }
  return true;
}

}  // namespace

absl::StatusOr<std::string> PythonJsonText(std::string_view json) {
  Json j = Json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("is not valid JSON");
  std::string out;
  if (!Write(j, 0, out)) {
    return absl::InvalidArgumentError(absl::StrCat("nests deeper than ", kMaxDepth, " levels"));
  }
  return out;
}

}  // namespace kvserve
