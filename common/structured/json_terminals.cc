#include "common/structured/json_terminals.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace kvserve::structured {
namespace {

// Bounds past this magnitude count as unbounded (their powers of ten would overflow).
constexpr uint64_t kMaxMagnitude = 1'000'000'000'000'000'000ULL;

std::string EscapeOf(uint8_t b) {
  switch (b) {
    case '"':
      return "\\\"";
    case '\\':
      return "\\\\";
    case '\n':
      return "\\n";
    case '\r':
      return "\\r";
    case '\t':
      return "\\t";
    case '\b':
      return "\\b";
    case '\f':
      return "\\f";
    default:
      return absl::StrFormat("\\u%04x", b);
  }
}

std::string DigitClass(char lo, char hi) {
  return lo == hi ? std::string(1, lo)
                  : absl::StrCat("[", std::string(1, lo), "-", std::string(1, hi), "]");
}

std::string AnyDigits(size_t n) { return n == 0 ? "" : absl::StrCat("[0-9]{", n, "}"); }

// The digit strings of length |x| from x to y (x <= y, same length).
std::string SameLength(const std::string& x, const std::string& y) {
  if (x.empty() || x == y) return x;
  const size_t n = x.size();
  if (x[0] == y[0]) return x.substr(0, 1) + SameLength(x.substr(1), y.substr(1));
  const std::string rest_x = x.substr(1), rest_y = y.substr(1);
  const bool x_low = rest_x.find_first_not_of('0') == std::string::npos;
  const bool y_high = rest_y.find_first_not_of('9') == std::string::npos;
  std::vector<std::string> parts;
  char lo = x[0], hi = y[0];
  if (!x_low) {
    parts.push_back(x.substr(0, 1) + SameLength(rest_x, std::string(n - 1, '9')));
    ++lo;
  }
  if (!y_high) --hi;
  if (lo <= hi) parts.push_back(DigitClass(lo, hi) + AnyDigits(n - 1));
  if (!y_high) parts.push_back(y.substr(0, 1) + SameLength(std::string(n - 1, '0'), rest_y));
  return absl::StrCat("(?:", absl::StrJoin(parts, "|"), ")");
}

uint64_t PowerOfTen(size_t n) {
  uint64_t p = 1;
  for (size_t i = 0; i < n; ++i) p *= 10;
  return p;
}

// The integers a..b (0 <= a <= b <= kMaxMagnitude) in decimal.
std::string NonNegative(uint64_t a, uint64_t b) {
  std::vector<std::string> parts;
  for (size_t len = std::to_string(a).size(); len <= std::to_string(b).size(); ++len) {
    const uint64_t x = std::max(a, len == 1 ? 0 : PowerOfTen(len - 1));
    const uint64_t y = std::min(b, PowerOfTen(len) - 1);
    if (x <= y) parts.push_back(SameLength(std::to_string(x), std::to_string(y)));
  }
  return absl::StrCat("(?:", absl::StrJoin(parts, "|"), ")");
}

// The integers from a up.
std::string AtLeast(uint64_t a) {
  const size_t len = std::to_string(a).size();
  return absl::StrCat("(?:", NonNegative(a, PowerOfTen(len) - 1), "|[1-9][0-9]{", len, ",})");
}

std::optional<uint64_t> Magnitude(std::optional<int64_t> v, bool negate) {
  if (!v) return std::nullopt;
  const int64_t m = negate ? -*v : *v;
  if (static_cast<uint64_t>(m) > kMaxMagnitude) return std::nullopt;
  return static_cast<uint64_t>(m);
}

}  // namespace

Nfa::Fragment JsonChar(Nfa& nfa) {
  const Nfa::Fragment raw = nfa.CodePoints({{0x20, 0x21}, {0x23, 0x5B}, {0x5D, kMaxCodePoint}});
  const Nfa::Fragment simple = nfa.Concat(nfa.Literal("\\"), nfa.CodePoints({{'"', '"'},
                                                                             {'\\', '\\'},
                                                                             {'/', '/'},
                                                                             {'b', 'b'},
                                                                             {'f', 'f'},
                                                                             {'n', 'n'},
                                                                             {'r', 'r'},
                                                                             {'t', 't'}}));
  const CodePointSet hex = {{'0', '9'}, {'A', 'F'}, {'a', 'f'}};
  auto hex_digits = [&](int n) {
    Nfa::Fragment f = nfa.Empty();
    for (int i = 0; i < n; ++i) f = nfa.Concat(f, nfa.CodePoints(hex));
    return f;
  };
  // \uXXXX: not D800-DFFF (a lone surrogate is no character).
  const Nfa::Fragment not_d = nfa.Concat(
      nfa.CodePoints({{'0', '9'}, {'A', 'C'}, {'E', 'F'}, {'a', 'c'}, {'e', 'f'}}), hex_digits(3));
  const Nfa::Fragment d = nfa.Concat(nfa.CodePoints({{'D', 'D'}, {'d', 'd'}}),
                                     nfa.Concat(nfa.CodePoints({{'0', '7'}}), hex_digits(2)));
  const Nfa::Fragment unicode = nfa.Concat(nfa.Literal("\\u"), nfa.Alternate(not_d, d));
  return nfa.Alternate(raw, nfa.Alternate(simple, unicode));
}

Nfa::Fragment JsonEscaped(const Dfa& dfa, Nfa& nfa) {
  const Nfa::Fragment f{nfa.AddState(), nfa.AddState()};
  std::vector<int32_t> at(dfa.num_states());
  for (int32_t& s : at) s = nfa.AddState();
  nfa.Link(f.start, at[dfa.start()]);
  for (Dfa::State s = 0; s < dfa.num_states(); ++s) {
    if (dfa.accepting(s)) nfa.Link(at[s], f.end);
    for (int b = 0; b < 256; ++b) {
      const Dfa::State t = dfa.Next(s, static_cast<uint8_t>(b));
      if (t == Dfa::kDead) continue;
      if (b == '"' || b == '\\' || b < 0x20) {
        const Nfa::Fragment e = nfa.Literal(EscapeOf(static_cast<uint8_t>(b)));
        nfa.Link(at[s], e.start);
        nfa.Link(e.end, at[t]);
        continue;
      }
      int hi = b;  // a run of bytes with the same target: one edge
      while (hi < 255 && dfa.Next(s, static_cast<uint8_t>(hi + 1)) == t) ++hi;
      nfa.AddEdge(at[s], static_cast<uint8_t>(b), static_cast<uint8_t>(hi), at[t]);
      b = hi;
    }
  }
  return f;
}

std::string IntegerRangeRegex(std::optional<int64_t> lo, std::optional<int64_t> hi) {
  std::vector<std::string> parts;
  if (!hi || *hi >= 0) {  // 0 and up
    const uint64_t a = lo && *lo > 0 ? *Magnitude(lo, false) : 0;
    const std::optional<uint64_t> b = Magnitude(hi, false);
    parts.push_back(b ? NonNegative(a, *b) : AtLeast(a));
  }
  if (!lo || *lo < 0) {  // -1 and down
    const uint64_t a = hi && *hi < 0 ? *Magnitude(hi, true) : 1;
    const std::optional<uint64_t> b = Magnitude(lo, true);
    parts.push_back(absl::StrCat("-", b ? NonNegative(a, *b) : AtLeast(a)));
  }
  return absl::StrCat("(?:", absl::StrJoin(parts, "|"), ")");
}

std::optional<std::string> FormatRegex(std::string_view format) {
  static const std::string kDate =
      "[0-9]{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]"
      "[0-9]|30)|02-(?:0[1-9]|1[0-9]|2[0-8]))";
  static const std::string kTime =
      "(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]{1,6})?(?:Z|[+-](?:[01][0-9]|2[0-3]):"
      "[0-5][0-9])";
  static const std::string kOctet = "(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])";
  if (format == "date") return kDate;
  if (format == "time") return kTime;
  if (format == "date-time") return absl::StrCat(kDate, "T", kTime);
  if (format == "uuid") {
    return "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}";
  }
  if (format == "ipv4") return absl::StrCat("(?:", kOctet, "\\.){3}", kOctet);
  if (format == "email") {
    return "[a-z0-9]+(?:[._+-][a-z0-9]+)*@[a-z0-9]+(?:-[a-z0-9]+)*(?:\\.[a-z0-9]+(?:-[a-z0-9]+)*)*"
           "\\.[a-z]{2,}";
  }
  return std::nullopt;
}

}  // namespace kvserve::structured
