#include "common/json_text.h"

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace kvserve {
namespace {

using Json = nlohmann::ordered_json;

constexpr int kMaxDepth = 512;  // Python's own json.dumps stops near 1000

class Writer {
 public:
  explicit Writer(int indent) : indent_(indent) {}

  // False past kMaxDepth.
  bool Write(const Json& j, int depth) {
    if (depth > kMaxDepth) return false;
    if (!j.is_object() && !j.is_array()) {
      out_ += j.dump(-1, ' ', false, Json::error_handler_t::replace);
      return true;
    }
    if (j.empty()) {
      out_ += j.is_object() ? "{}" : "[]";
      return true;
    }
    out_ += j.is_object() ? '{' : '[';
    bool first = true;
    for (const auto& [key, value] : j.items()) {
      out_ += first ? "" : (indent_ >= 0 ? "," : ", ");
      first = false;
      NewLine(depth + 1);
      if (j.is_object()) {
        out_ += Json(key).dump(-1, ' ', false, Json::error_handler_t::replace);
        out_ += ": ";
      }
      if (!Write(value, depth + 1)) return false;
    }
    NewLine(depth);
    out_ += j.is_object() ? '}' : ']';
    return true;
  }

  std::string Take() { return std::move(out_); }

 private:
  void NewLine(int depth) {
    if (indent_ < 0) return;
    out_ += '\n';
    out_.append(static_cast<size_t>(depth) * indent_, ' ');
  }

  int indent_;
  std::string out_;
};

}  // namespace

absl::StatusOr<std::string> PythonJsonText(std::string_view json, int indent) {
  Json j = Json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("is not valid JSON");
  Writer w(indent);
  if (!w.Write(j, 0)) {
    return absl::InvalidArgumentError(absl::StrCat("nests deeper than ", kMaxDepth, " levels"));
  }
  return w.Take();
}

std::string PythonJsonString(std::string_view text) {
  return Json(std::string(text)).dump(-1, ' ', false, Json::error_handler_t::replace);
}

}  // namespace kvserve
