#include "common/structured/gbnf.h"

#include <cctype>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/string_util.h"
#include "common/structured/regex.h"
#include "common/utf8.h"

namespace kvserve::structured {
namespace {

constexpr int kMaxNesting = 100;
constexpr int64_t kMaxRepeat = 1000;

struct Item {
  enum class Kind { kLiteral, kClass, kAny, kRef, kGroup };
  Kind kind = Kind::kLiteral;
  std::string text;                             // kLiteral: the bytes; kClass: the class as written
  int32_t rule = 0;                             // kRef
  std::vector<std::vector<Item>> alternatives;  // kGroup
  int64_t min = 1, max = 1;                     // max -1: unbounded
};
using Alternatives = std::vector<std::vector<Item>>;

bool NameChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
}

class Parser {
 public:
  Parser(std::string_view text, GrammarBuilder& builder) : text_(text), builder_(builder) {}

  // Every rule's alternatives, by rule id.
  absl::StatusOr<std::map<int32_t, Alternatives>> Parse() {
    std::map<int32_t, Alternatives> rules;
    SkipSpace();
    while (pos_ < text_.size()) {
      const size_t at = pos_;
      const std::string name = Name();
      if (name.empty()) return Error("a rule name");
      SkipSpace();
      if (text_.substr(pos_, 3) != "::=") return Error("'::=' after the rule name");
      pos_ += 3;
      const int32_t id = RuleId(name);
      if (rules.contains(id)) {
        pos_ = at;
        return Error(absl::StrCat("one definition of rule '", name, "'"), "a second one");
      }
      ASSIGN_OR_RETURN(rules[id], ParseAlternatives(0));
      if (pos_ < text_.size() && text_[pos_] == ')') return Error("a rule", "an unmatched ')'");
    }
    if (!ids_.contains("root")) return absl::InvalidArgumentError("the grammar has no rule 'root'");
    return rules;
  }

  int32_t RuleId(const std::string& name) {
    auto [it, added] = ids_.try_emplace(name, 0);
    if (added) it->second = builder_.Declare(name);
    return it->second;
  }

 private:
  absl::Status Error(std::string_view expected, std::string_view found = "") {
    int line = 1, column = 1;
    for (size_t i = 0; i < pos_ && i < text_.size(); ++i) {
      column = text_[i] == '\n' ? 1 : column + 1;
      line += text_[i] == '\n';
    }
    std::string what(found);
    if (what.empty()) {
      what = pos_ < text_.size() ? absl::StrCat("'", Sv(text_.substr(pos_, 1)), "'") : "the end";
    }
    return absl::InvalidArgumentError(absl::StrCat("grammar line ", line, " column ", column,
                                                   ": expected ", Sv(expected), ", found ", what));
  }

  void SkipSpace() {
    while (pos_ < text_.size()) {
      if (std::isspace(static_cast<unsigned char>(text_[pos_]))) {
        ++pos_;
      } else if (text_[pos_] == '#') {
        while (pos_ < text_.size() && text_[pos_] != '\n') ++pos_;
      } else {
        break;
      }
    }
  }

  std::string Name() {
    const size_t start = pos_;
    while (pos_ < text_.size() && NameChar(text_[pos_])) ++pos_;
    return std::string(text_.substr(start, pos_ - start));
  }

  // Whether a new rule (`name ::=`) starts at pos_.
  bool AtRuleStart() {
    size_t p = pos_;
    while (p < text_.size() && NameChar(text_[p])) ++p;
    if (p == pos_) return false;
    while (p < text_.size() &&
           (text_[p] == ' ' || text_[p] == '\t' || text_[p] == '\r' || text_[p] == '\n')) {
      ++p;
    }
    return text_.substr(p, 3) == "::=";
  }

  absl::StatusOr<Alternatives> ParseAlternatives(int depth) {
    if (depth > kMaxNesting) return Error("fewer nested groups");
    Alternatives out;
    while (true) {
      ASSIGN_OR_RETURN(std::vector<Item> seq, ParseSequence(depth));
      out.push_back(std::move(seq));
      SkipSpace();
      if (pos_ >= text_.size() || text_[pos_] != '|') return out;
      ++pos_;
    }
  }

  absl::StatusOr<std::vector<Item>> ParseSequence(int depth) {
    std::vector<Item> seq;
    while (true) {
      SkipSpace();
      if (pos_ >= text_.size() || text_[pos_] == '|' || text_[pos_] == ')' || AtRuleStart()) {
        return seq;
      }
      ASSIGN_OR_RETURN(Item item, ParsePrimary(depth));
      RETURN_IF_ERROR(ParseQuantifier(item));
      seq.push_back(std::move(item));
    }
  }

  absl::StatusOr<Item> ParsePrimary(int depth) {
    Item item;
    const char c = text_[pos_];
    if (c == '"') {
      ++pos_;
      ASSIGN_OR_RETURN(item.text, ParseString());
    } else if (c == '[') {
      item.kind = Item::Kind::kClass;
      ASSIGN_OR_RETURN(item.text, ParseClass());
    } else if (c == '.') {
      item.kind = Item::Kind::kAny;
      ++pos_;
    } else if (c == '(') {
      ++pos_;
      item.kind = Item::Kind::kGroup;
      ASSIGN_OR_RETURN(item.alternatives, ParseAlternatives(depth + 1));
      if (pos_ >= text_.size() || text_[pos_] != ')') return Error("')'");
      ++pos_;
    } else if (NameChar(c)) {
      item.kind = Item::Kind::kRef;
      item.rule = RuleId(Name());
    } else {
      return Error("a string, a class, a rule name or '('");
    }
    return item;
  }

  absl::StatusOr<std::string> ParseString() {
    std::string out;
    while (pos_ < text_.size() && text_[pos_] != '"') {
      if (text_[pos_] != '\\') {
        out += text_[pos_++];
        continue;
      }
      ASSIGN_OR_RETURN(uint32_t cp, ParseEscape());
      AppendUtf8(cp, out);
    }
    if (pos_ >= text_.size()) return Error("the closing '\"'");
    ++pos_;
    if (!IsValidUtf8(out)) return Error("valid UTF-8 in the string");
    return out;
  }

  // The code point of the escape at pos_ (a backslash).
  absl::StatusOr<uint32_t> ParseEscape() {
    if (pos_ + 1 >= text_.size()) return Error("an escape");
    const char e = text_[pos_ + 1];
    pos_ += 2;
    switch (e) {
      case 'n':
        return '\n';
      case 'r':
        return '\r';
      case 't':
        return '\t';
      case '\\':
      case '"':
      case '[':
      case ']':
      case '-':
      case '^':
        return static_cast<uint32_t>(e);
      case 'x':
      case 'u':
      case 'U': {
        const size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        int value = 0;
        if (pos_ + n > text_.size() || !absl::SimpleHexAtoi(Sv(text_.substr(pos_, n)), &value) ||
            value > 0x10FFFF || (value >= 0xD800 && value <= 0xDFFF)) {
          return Error(absl::StrCat(n, " hex digits of a character"));
        }
        pos_ += n;
        return static_cast<uint32_t>(value);
      }
      default:
        pos_ -= 1;
        return Error("an escape \\n \\r \\t \\\\ \\\" \\xHH \\uHHHH or \\UHHHHHHHH");
    }
  }

  // The class as written, from '[' to its ']'.
  absl::StatusOr<std::string> ParseClass() {
    const size_t start = pos_++;
    while (pos_ < text_.size() && text_[pos_] != ']') pos_ += text_[pos_] == '\\' ? 2 : 1;
    if (pos_ >= text_.size()) return Error("the closing ']'");
    ++pos_;
    return std::string(text_.substr(start, pos_ - start));
  }

  absl::Status ParseQuantifier(Item& item) {
    if (pos_ >= text_.size()) return absl::OkStatus();
    const char q = text_[pos_];
    if (q == '*' || q == '+' || q == '?') {
      ++pos_;
      item.min = q == '+' ? 1 : 0;
      item.max = q == '?' ? 1 : -1;
      return absl::OkStatus();
    }
    if (q != '{') return absl::OkStatus();
    const size_t close = text_.find('}', pos_);
    if (close == std::string_view::npos) return Error("'}'");
    const std::string_view body = text_.substr(pos_ + 1, close - pos_ - 1);
    const size_t comma = body.find(',');
    int64_t min = 0, max = 0;
    const bool ok =
        absl::SimpleAtoi(Sv(body.substr(0, comma)), &min) &&
        (comma == std::string_view::npos ? (max = min, true)
         : comma + 1 == body.size()      ? (max = -1, true)
                                         : absl::SimpleAtoi(Sv(body.substr(comma + 1)), &max));
    if (!ok || min < 0 || min > kMaxRepeat || max > kMaxRepeat || (max >= 0 && max < min)) {
      return Error(absl::StrCat("{n}, {n,} or {n,m} with 0 <= n <= m <= ", kMaxRepeat));
    }
    pos_ = close + 1;
    item.min = min;
    item.max = max;
    return absl::OkStatus();
  }

  std::string_view text_;
  size_t pos_ = 0;
  GrammarBuilder& builder_;
  std::map<std::string, int32_t> ids_;
};

absl::StatusOr<Nfa::Fragment> Build(const Alternatives& alts, Nfa& nfa);

absl::StatusOr<Nfa::Fragment> BuildOnce(const Item& item, Nfa& nfa) {
  switch (item.kind) {
    case Item::Kind::kLiteral:
      return nfa.Literal(item.text);
    case Item::Kind::kAny:
      return nfa.CodePoints({{0, kMaxCodePoint}});
    case Item::Kind::kRef:
      return nfa.Call(item.rule);
    case Item::Kind::kGroup:
      return Build(item.alternatives, nfa);
    case Item::Kind::kClass: {
      absl::StatusOr<Nfa::Fragment> f = AddRegex(item.text, nfa);
      if (!f.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("grammar class ", item.text, ": ", f.status().message()));
      }
      return f;
    }
  }
  return absl::InternalError("unknown grammar item");
}

absl::StatusOr<Nfa::Fragment> BuildItem(const Item& item, Nfa& nfa) {
  return Repeat(
      nfa, [&] { return BuildOnce(item, nfa); }, item.min, item.max);
}

absl::StatusOr<Nfa::Fragment> Build(const Alternatives& alts, Nfa& nfa) {
  std::optional<Nfa::Fragment> out;
  for (const std::vector<Item>& seq : alts) {
    Nfa::Fragment f = nfa.Empty();
    for (const Item& item : seq) {
      ASSIGN_OR_RETURN(Nfa::Fragment x, BuildItem(item, nfa));
      f = nfa.Concat(f, x);
      if (nfa.too_large()) return absl::ResourceExhaustedError("the grammar is too large");
    }
    out = out ? nfa.Alternate(*out, f) : f;
  }
  return *out;
}

// Whether `text` reads as Lark's notation (what vLLM's guidance and outlines backends take):
// a `%import` / `%ignore` directive, or a line that defines a rule with `name:` instead of
// `name ::=`.
bool LooksLikeLark(std::string_view text) {
  for (size_t start = 0; start < text.size();) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(start, end - start);
    start = end + 1;
    while (!line.empty() && (line[0] == ' ' || line[0] == '\t')) line.remove_prefix(1);
    if (line.starts_with("%import") || line.starts_with("%ignore")) return true;
    if (!line.empty() && (line[0] == '?' || line[0] == '!')) line.remove_prefix(1);
    size_t n = 0;
    while (n < line.size() && (std::isalnum(static_cast<unsigned char>(line[n])) ||
                               line[n] == '_' || line[n] == '.')) {
      ++n;
    }
    std::string_view rest = line.substr(n);
    while (!rest.empty() && (rest[0] == ' ' || rest[0] == '\t')) rest.remove_prefix(1);
    if (n > 0 && rest.starts_with(":") && !rest.starts_with("::=")) return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<Grammar> CompileGbnf(std::string_view text, const GrammarLimits& limits) {
  if (!IsValidUtf8(text)) return absl::InvalidArgumentError("the grammar is not valid UTF-8");
  GrammarBuilder builder(limits);
  Parser parser(text, builder);
  absl::StatusOr<std::map<int32_t, Alternatives>> parsed = parser.Parse();
  if (!parsed.ok() && LooksLikeLark(text)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the grammar is in Lark notation (`rule: ...`, `%import`), which kvserve does not "
        "compile; write it in GBNF, llama.cpp's notation that xgrammar's EBNF also takes "
        "(`root ::= ...`, rules `name ::= ...`, terminals \"...\" and [...]) (",
        parsed.status().message(), ")"));
  }
  ASSIGN_OR_RETURN(auto rules, std::move(parsed));
  for (const auto& [id, alts] : rules) {
    ASSIGN_OR_RETURN(Nfa::Fragment body, Build(alts, builder.nfa()));
    builder.Define(id, body);
  }
  return std::move(builder).Build(parser.RuleId("root"));
}

}  // namespace kvserve::structured
