#include "frontend/output/model_json.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/json_text.h"

namespace kvserve::frontend {
namespace {

using Json = nlohmann::ordered_json;

// Printable, so that it is written as it is; random per process, so that no model text holds
// it (and text that does is not shielded).
const std::string& Marker() {
  static const std::string marker = [] {
    std::random_device rd;
    const uint64_t r = (uint64_t{rd()} << 32) | rd();
    return absl::StrFormat("kvserve-number-%016x:", r);
  }();
  return marker;
}

bool IsNumberChar(char c) {
  return absl::ascii_isdigit(static_cast<unsigned char>(c)) || c == '-' || c == '+' || c == '.' ||
         c == 'e' || c == 'E';
}

// `text` with each number outside strings whose value overflows a double written as a
// placeholder string.
std::string Shield(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  JsonStringScan scan;
  for (size_t i = 0; i < text.size();) {
    const char c = text[i];
    if (scan.InString(c) || (c != '-' && !absl::ascii_isdigit(static_cast<unsigned char>(c)))) {
      out += c;
      ++i;
      continue;
    }
    size_t end = i + 1;
    while (end < text.size() && IsNumberChar(text[end])) ++end;
    const std::string number(text.substr(i, end - i));
    if (std::isinf(std::strtod(number.c_str(), nullptr))) {
      absl::StrAppend(&out, "\"", Marker(), number, "\"");
    } else {
      out += number;
    }
    i = end;
  }
  return out;
}

}  // namespace

Json ParseModelJson(std::string_view text) {
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_discarded() || text.find(Marker()) != std::string_view::npos) return j;
  return Json::parse(Shield(text), nullptr, /*allow_exceptions=*/false);
}

std::string RestoreNumbers(std::string json) {
  const std::string quoted = absl::StrCat("\"", Marker());
  for (size_t at = json.find(quoted); at != std::string::npos; at = json.find(quoted, at)) {
    const size_t number = at + quoted.size();
    const size_t close = json.find('"', number);
    if (close == std::string::npos) break;
    json.replace(at, close + 1 - at, json.substr(number, close - number));
  }
  return json;
}

}  // namespace kvserve::frontend
