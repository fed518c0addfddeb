#include "common/structured/regex.h"

#include <algorithm>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/string_util.h"
#include "common/utf8.h"

namespace kvserve::structured {
namespace {

struct Node {
  enum class Kind { kEmpty, kChars, kConcat, kAlternate, kRepeat };
  Kind kind = Kind::kEmpty;
  CodePointSet chars;
  std::vector<Node> children;
  int32_t min = 0, max = -1;  // kRepeat; -1: unbounded
};

const CodePointSet kDigits = {{'0', '9'}};
const CodePointSet kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
// ECMAScript's WhiteSpace and LineTerminator.
const CodePointSet kSpace = {{'\t', '\r'},     {' ', ' '},       {0xA0, 0xA0},     {0x1680, 0x1680},
                             {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F},
                             {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
const CodePointSet kLineTerminators = {{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}};

// The code points of valid UTF-8 `s`.
std::vector<uint32_t> CodePointsOf(std::string_view s) {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < s.size();) {
    const size_t n = Utf8SequenceLength(s, i);
    auto b = static_cast<uint8_t>(s[i]);
    uint32_t c = n == 1 ? b : n == 2 ? b & 0x1F : n == 3 ? b & 0x0F : b & 0x07;
    for (size_t k = 1; k < n; ++k) c = (c << 6) | (static_cast<uint8_t>(s[i + k]) & 0x3F);
    out.push_back(c);
    i += n;
  }
  return out;
}

Node Chars(CodePointSet set) {
  Node n;
  n.kind = Node::Kind::kChars;
  n.chars = Normalize(std::move(set));
  return n;
}

class Parser {
 public:
  Parser(std::string_view pattern, const RegexLimits& limits)
      : cps_(CodePointsOf(pattern)), limits_(limits) {}

  absl::StatusOr<Node> Parse() {
    ASSIGN_OR_RETURN(Node n, Alternation(0));
    if (pos_ < cps_.size()) return Error("unmatched ')'");
    return n;
  }

 private:
  [[nodiscard]] bool AtEnd() const { return pos_ >= cps_.size(); }
  [[nodiscard]] uint32_t Peek(size_t ahead = 0) const {
    return pos_ + ahead < cps_.size() ? cps_[pos_ + ahead] : 0xFFFFFFFF;
  }
  [[nodiscard]] absl::Status Error(std::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(Sv(what), " at offset ", pos_));
  }

  absl::StatusOr<Node> Alternation(int depth) {
    Node alt;
    alt.kind = Node::Kind::kAlternate;
    while (true) {
      ASSIGN_OR_RETURN(Node branch, Concat(depth));
      alt.children.push_back(std::move(branch));
      if (Peek() != '|') break;
      ++pos_;
    }
    if (alt.children.size() == 1) return std::move(alt.children[0]);
    return alt;
  }

  absl::StatusOr<Node> Concat(int depth) {
    Node cat;
    cat.kind = Node::Kind::kConcat;
    while (!AtEnd() && Peek() != '|' && Peek() != ')') {
      if (Peek() == '^' || Peek() == '$') {
        // The whole string is matched: an anchor at the pattern's (or a top-level branch's)
        // start or end says nothing more; anywhere else it would constrain the middle.
        const bool start = Peek() == '^' && depth == 0 && cat.children.empty();
        const bool end = Peek() == '$' && depth == 0 && (Peek(1) == '|' || pos_ + 1 == cps_.size());
        if (!start && !end) return Error("an anchor inside the pattern is not supported");
        ++pos_;
        continue;
      }
      ASSIGN_OR_RETURN(Node atom, Atom(depth));
      ASSIGN_OR_RETURN(atom, Quantified(std::move(atom)));
      cat.children.push_back(std::move(atom));
    }
    if (cat.children.size() == 1) return std::move(cat.children[0]);
    if (cat.children.empty()) return Node{};
    return cat;
  }

  // A quantifier's {n}, {n,} or {n,m} from pos_ ('{' read), or nullopt (then '{' is literal).
  std::optional<std::pair<int64_t, int64_t>> Braces() {
    size_t p = pos_;
    auto number = [&](int64_t* v) {
      const size_t from = p;
      *v = 0;
      while (p < cps_.size() && cps_[p] >= '0' && cps_[p] <= '9') {
        *v = std::min<int64_t>(*v * 10 + (cps_[p] - '0'), INT32_MAX);
        ++p;
      }
      return p > from;
    };
    int64_t lo = 0, hi = 0;
    if (!number(&lo)) return std::nullopt;
    hi = lo;
    if (p < cps_.size() && cps_[p] == ',') {
      ++p;
      if (!number(&hi)) hi = -1;
    }
    if (p >= cps_.size() || cps_[p] != '}') return std::nullopt;
    pos_ = p + 1;
    return std::make_pair(lo, hi);
  }

  absl::StatusOr<Node> Quantified(Node atom) {
    while (!AtEnd()) {
      int64_t lo = 0, hi = -1;
      const uint32_t c = Peek();
      if (c == '*') {
        ++pos_;
      } else if (c == '+') {
        lo = 1, ++pos_;
      } else if (c == '?') {
        hi = 1, ++pos_;
      } else if (c == '{') {
        const size_t at = pos_++;
        std::optional<std::pair<int64_t, int64_t>> b = Braces();
        if (!b) {
          pos_ = at;
          break;
        }
        std::tie(lo, hi) = *b;
        if (hi >= 0 && hi < lo) return Error("a quantifier {n,m} with m < n");
        if (lo > limits_.max_repeat || hi > limits_.max_repeat) {
          return Error(absl::StrCat("a repetition count above ", limits_.max_repeat));
        }
      } else {
        break;
      }
      if (Peek() == '?') ++pos_;  // lazy: the same strings match the whole pattern
      Node rep;
      rep.kind = Node::Kind::kRepeat;
      rep.min = static_cast<int32_t>(lo);
      rep.max = static_cast<int32_t>(hi);
      rep.children.push_back(std::move(atom));
      atom = std::move(rep);
    }
    return atom;
  }

  absl::StatusOr<Node> Atom(int depth) {
    const uint32_t c = Peek();
    switch (c) {
      case '(':
        return Group(depth);
      case '[':
        return Class();
      case '.':
        ++pos_;
        return Chars(Complement(kLineTerminators));
      case '\\': {
        ++pos_;
        ASSIGN_OR_RETURN(CodePointSet set, Escape(/*in_class=*/false));
        return Chars(std::move(set));
      }
      case '*':
      case '+':
      case '?':
        return Error("a quantifier with nothing to repeat");
      case '{': {
        const size_t at = pos_++;
        if (Braces()) {
          pos_ = at;
          return Error("a quantifier with nothing to repeat");
        }
        return Chars({{c, c}});  // not a quantifier: a literal brace
      }
      default:
        ++pos_;
        return Chars({{c, c}});
    }
  }

  absl::StatusOr<Node> Group(int depth) {
    ++pos_;  // '('
    if (Peek() == '?') {
      const uint32_t k = Peek(1);
      if (k == ':') {
        pos_ += 2;
      } else if (k == '=' || k == '!' || (k == '<' && (Peek(2) == '=' || Peek(2) == '!'))) {
        return Error("lookaround is not supported");
      } else if (k == '<' || (k == 'P' && Peek(2) == '<')) {  // a named group
        while (!AtEnd() && Peek() != '>') ++pos_;
        if (AtEnd()) return Error("an unterminated group name");
        ++pos_;
      } else {
        return Error("inline flags and other (?...) groups are not supported");
      }
    }
    ASSIGN_OR_RETURN(Node inner, Alternation(depth + 1));
    if (Peek() != ')') return Error("a '(' without its ')'");
    ++pos_;
    return inner;
  }

  absl::StatusOr<Node> Class() {
    ++pos_;  // '['
    bool negate = false;
    if (Peek() == '^') negate = true, ++pos_;
    CodePointSet set;
    while (!AtEnd() && Peek() != ']') {
      ASSIGN_OR_RETURN(CodePointSet lo, ClassAtom());
      if (Peek() == '-' && Peek(1) != ']' && pos_ + 1 < cps_.size()) {
        ++pos_;
        ASSIGN_OR_RETURN(CodePointSet hi, ClassAtom());
        if (lo.size() != 1 || hi.size() != 1 || lo[0].first != lo[0].second ||
            hi[0].first != hi[0].second) {
          return Error("a class range whose end is a class escape");
        }
        if (hi[0].first < lo[0].first) return Error("a class range out of order");
        set.emplace_back(lo[0].first, hi[0].first);
        continue;
      }
      set.insert(set.end(), lo.begin(), lo.end());
    }
    if (AtEnd()) return Error("a '[' without its ']'");
    ++pos_;
    return Chars(negate ? Complement(set) : Normalize(set));
  }

  absl::StatusOr<CodePointSet> ClassAtom() {
    const uint32_t c = Peek();
    ++pos_;
    if (c != '\\') return CodePointSet{{c, c}};
    return Escape(/*in_class=*/true);
  }

  // Hex digits from pos_: exactly `count`, or up to '}' when count is 0.
  absl::StatusOr<uint32_t> Hex(int count) {
    uint32_t v = 0;
    int n = 0;
    while (!AtEnd() && (count == 0 ? Peek() != '}' : n < count)) {
      const uint32_t c = Peek();
      const int d = c >= '0' && c <= '9'   ? static_cast<int>(c - '0')
                    : c >= 'a' && c <= 'f' ? static_cast<int>(c - 'a' + 10)
                    : c >= 'A' && c <= 'F' ? static_cast<int>(c - 'A' + 10)
                                           : -1;
      if (d < 0) return Error("a bad hexadecimal escape");
      v = v * 16 + d;
      if (v > kMaxCodePoint) return Error("an escape past U+10FFFF");
      ++pos_, ++n;
    }
    if (n == 0 || (count > 0 && n < count)) return Error("a bad hexadecimal escape");
    return v;
  }

  // What follows a backslash (read).
  absl::StatusOr<CodePointSet> Escape(bool in_class) {
    if (AtEnd()) return Error("a pattern ending in '\\'");
    const uint32_t c = Peek();
    ++pos_;
    auto one = [](uint32_t v) { return CodePointSet{{v, v}}; };
    switch (c) {
      case 'd':
        return kDigits;
      case 'D':
        return Complement(kDigits);
      case 'w':
        return kWord;
      case 'W':
        return Complement(kWord);
      case 's':
        return kSpace;
      case 'S':
        return Complement(kSpace);
      case 'n':
        return one('\n');
      case 'r':
        return one('\r');
      case 't':
        return one('\t');
      case 'f':
        return one('\f');
      case 'v':
        return one('\v');
      case 'x': {
        ASSIGN_OR_RETURN(uint32_t v, Hex(2));
        return one(v);
      }
      case 'u': {
        if (Peek() != '{') {
          ASSIGN_OR_RETURN(uint32_t v, Hex(4));
          return one(v);
        }
        ++pos_;
        ASSIGN_OR_RETURN(uint32_t v, Hex(0));
        if (Peek() != '}') return Error("a '\\u{' without its '}'");
        ++pos_;
        return one(v);
      }
      case 'b':
        if (in_class) return one('\b');
        return Error("word boundaries (\\b) are not supported");
      case 'B':
        return Error("word boundaries (\\B) are not supported");
      case 'p':
      case 'P':
        return Error("Unicode property escapes are not supported");
      case 'k':
        return Error("backreferences are not supported");
      default:
        break;
    }
    if (c == '0' && !(Peek() >= '0' && Peek() <= '9')) return one(0);
    if (c >= '0' && c <= '9') return Error("backreferences are not supported");
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
      return Error(
          absl::StrCat("an unknown escape '\\", std::string(1, static_cast<char>(c)), "'"));
    }
    return one(c);  // escaped punctuation (or any other character) stands for itself
  }

  std::vector<uint32_t> cps_;
  size_t pos_ = 0;
  RegexLimits limits_;
};

absl::StatusOr<Nfa::Fragment> Build(const Node& n, Nfa& nfa) {
  if (nfa.too_large()) return nfa.Empty();  // ToDfa reports it
  switch (n.kind) {
    case Node::Kind::kEmpty:
      return nfa.Empty();
    case Node::Kind::kChars:
      return n.chars.empty() ? nfa.Nothing() : nfa.CodePoints(n.chars);
    case Node::Kind::kConcat: {
      ASSIGN_OR_RETURN(Nfa::Fragment f, Build(n.children[0], nfa));
      for (size_t i = 1; i < n.children.size(); ++i) {
        ASSIGN_OR_RETURN(Nfa::Fragment g, Build(n.children[i], nfa));
        f = nfa.Concat(f, g);
      }
      return f;
    }
    case Node::Kind::kAlternate: {
      ASSIGN_OR_RETURN(Nfa::Fragment f, Build(n.children[0], nfa));
      for (size_t i = 1; i < n.children.size(); ++i) {
        ASSIGN_OR_RETURN(Nfa::Fragment g, Build(n.children[i], nfa));
        f = nfa.Alternate(f, g);
      }
      return f;
    }
    case Node::Kind::kRepeat: {
      const Node& x = n.children[0];
      return Repeat(
          nfa, [&] { return Build(x, nfa); }, n.min, n.max);
    }
  }
  return nfa.Empty();
}

}  // namespace

absl::StatusOr<Nfa::Fragment> AddRegex(std::string_view pattern, Nfa& nfa,
                                       const RegexLimits& limits) {
  if (!IsValidUtf8(pattern)) return absl::InvalidArgumentError("the pattern is not valid UTF-8");
  Parser parser(pattern, limits);
  ASSIGN_OR_RETURN(Node root, parser.Parse());
  return Build(root, nfa);
}

absl::StatusOr<Dfa> CompileRegex(std::string_view pattern, const RegexLimits& limits) {
  Nfa nfa(limits.max_nfa_states);
  ASSIGN_OR_RETURN(Nfa::Fragment f, AddRegex(pattern, nfa, limits));
  return nfa.ToDfa(f, limits.max_dfa_states, limits.max_work);
}

}  // namespace kvserve::structured
