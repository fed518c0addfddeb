#include "frontend/request/request_fields.h"

#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/string_util.h"

namespace kvserve::frontend::request_fields {

absl::Status Bad(std::string_view param, std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(Sv(param), ": ", Sv(what)));
}

std::optional<element> Field(object o, std::string_view key) {
  element e;
  if (o[key].get(e) != simdjson::SUCCESS || e.is_null()) return std::nullopt;
  return e;
}

absl::StatusOr<double> Number(object o, std::string_view key, double fallback, double lo,
                              double hi) {
  auto e = Field(o, key);
  if (!e) return fallback;
  double v;
  if (e->get_double().get(v) != simdjson::SUCCESS) {
    int64_t i;
    if (e->get_int64().get(i) != simdjson::SUCCESS) return Bad(key, "must be a number");
    v = static_cast<double>(i);
  }
  if (!(v >= lo && v <= hi))
    return Bad(key, absl::StrCat("must be in [", lo, ", ", hi, "], got ", v));
  return v;
}

absl::StatusOr<int64_t> Integer(object o, std::string_view key, int64_t fallback, int64_t lo,
                                int64_t hi) {
  auto e = Field(o, key);
  if (!e) return fallback;
  int64_t v;
  if (e->get_int64().get(v) != simdjson::SUCCESS) return Bad(key, "must be an integer");
  if (v < lo || v > hi) return Bad(key, absl::StrCat("must be in [", lo, ", ", hi, "], got ", v));
  return v;
}

absl::StatusOr<bool> Bool(object o, std::string_view key, bool fallback) {
  auto e = Field(o, key);
  if (!e) return fallback;
  bool v;
  if (e->get_bool().get(v) != simdjson::SUCCESS) return Bad(key, "must be true or false");
  return v;
}

// A nested field `key` of `o` as a bool, its errors naming `param` (its full name).
absl::StatusOr<bool> NestedBool(object o, std::string_view key, std::string_view param,
                                bool fallback) {
  auto e = Field(o, key);
  bool v = fallback;
  if (e && e->get_bool().get(v) != simdjson::SUCCESS) return Bad(param, "must be true or false");
  return v;
}

absl::StatusOr<bool> LaxBool(object o, std::string_view key, bool fallback) {
  auto e = Field(o, key);
  if (!e) return fallback;
  bool v;
  if (e->get_bool().get(v) == simdjson::SUCCESS) return v;
  int64_t i;
  if (e->get_int64().get(i) == simdjson::SUCCESS && (i == 0 || i == 1)) return i == 1;
  std::string_view text;
  if (e->get_string().get(text) == simdjson::SUCCESS) {
    const std::string lower = absl::AsciiStrToLower(Sv(text));
    for (const char* yes : {"true", "1", "yes", "on", "t", "y"}) {
      if (lower == yes) return true;
    }
    for (const char* no : {"false", "0", "no", "off", "f", "n"}) {
      if (lower == no) return false;
    }
  }
  return Bad(key, "must be true or false");
}

absl::StatusOr<std::string> String(object o, std::string_view key) {
  auto e = Field(o, key);
  if (!e) return std::string();
  std::string_view v;
  if (e->get_string().get(v) != simdjson::SUCCESS) return Bad(key, "must be a string");
  return std::string(v);
}

absl::Status Unserved(std::string_view param, std::string_view neutral) {
  return Bad(param, absl::StrCat("is not supported by kvserve; leave it unset", Sv(neutral)));
}

bool NonEmptyArray(object o, std::string_view key) {
  auto e = Field(o, key);
  simdjson::dom::array arr;
  return e && (e->get_array().get(arr) != simdjson::SUCCESS || arr.size() != 0);
}

absl::Status TooLong(std::string_view param, int64_t bytes, const RequestLimits& limits) {
  return Bad(param, absl::StrCat("has over ", bytes, " bytes of text; the limit is ",
                                 limits.max_prompt_bytes, " (--max-prompt-bytes)"));
}

}  // namespace kvserve::frontend::request_fields
