// The regex compiler against its definition: hand-written cases (Unicode and bytes included),
// std::regex (ECMAScript) as an independent reference on ASCII strings, random strings of the
// automaton's own language checked the same way, and clear refusals of what is not served.
#include "common/structured/regex.h"

#include <random>
#include <regex>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace kvserve::structured {
namespace {

using ::kvserve::testing::StatusIs;
using ::testing::HasSubstr;

Dfa Compile(const std::string& pattern) {
  absl::StatusOr<Dfa> dfa = CompileRegex(pattern);
  EXPECT_OK(dfa) << pattern;
  return dfa.ok() ? *std::move(dfa) : *CompileRegex("x");
}

TEST(RegexTest, HandWrittenCases) {
  struct Case {
    std::string pattern;
    std::vector<std::string> yes, no;
  };
  const std::vector<Case> cases = {
      {"abc", {"abc"}, {"", "ab", "abcd", "abd"}},
      {"^a|b$", {"a", "b"}, {"ab", ""}},
      {"a*b+c?", {"b", "aabbc", "abbb"}, {"", "a", "ac", "bcc"}},
      {"(ab|cd){2,3}", {"abcd", "cdcdab", "ababab"}, {"ab", "abababab", "abc"}},
      {"x{3}", {"xxx"}, {"xx", "xxxx"}},
      {"x{2,}", {"xx", "xxxxxx"}, {"x"}},
      {"x{0}", {""}, {"x"}},
      {"a{,3}", {"a{,3}"}, {"aaa"}},  // not a quantifier: literal braces, as ECMAScript reads it
      {"[a-c-]+", {"a-b", "-", "cab"}, {"d", ""}},
      {"[^abc]", {"d", "é", "😀", "\n"}, {"a", "", "dd"}},
      {"[^]", {"a", "\n", "é"}, {"", "ab"}},
      {".", {"a", "é", "€", "😀"}, {"\n", "\r", "\xE2\x80\xA8", "", "ab"}},
      {"\\d+\\.\\d*", {"3.", "12.50"}, {".5", "a.1"}},
      {"\\w\\W\\s\\S", {"a. b", "_\t\xC2\xA0x"}, {"a bc", "ab c"}},
      {"\\x41\\u00e9\\u{1F600}", {"Aé😀"}, {"Ae😀"}},
      {"[\\u00e0-\\u00ff]+", {"éü", "à"}, {"e", "ß"}},
      {"(?:a|b)(?<name>c)", {"ac", "bc"}, {"c"}},
      {"a+?b??", {"a", "ab", "aab"}, {"b"}},
      {"\\.\\*\\\\\\/\\-", {".*\\/-"}, {"x"}},
      {"[\\b]", {"\b"}, {"b"}},
      {"\\0", {std::string(1, '\0')}, {"0"}},
  };
  for (const Case& c : cases) {
    const Dfa dfa = Compile(c.pattern);
    for (const std::string& s : c.yes) EXPECT_TRUE(dfa.Matches(s)) << c.pattern << " on " << s;
    for (const std::string& s : c.no) EXPECT_FALSE(dfa.Matches(s)) << c.pattern << " on " << s;
  }
}

TEST(RegexTest, BytesInsideACharacterKeepThePrefixAlive) {
  const Dfa dfa = Compile("é+");
  const Dfa::State half = dfa.Walk(dfa.start(), "\xC3");
  ASSERT_NE(half, Dfa::kDead);
  EXPECT_FALSE(dfa.accepting(half));
  EXPECT_TRUE(dfa.accepting(dfa.Walk(half, "\xA9")));
  EXPECT_EQ(dfa.Walk(dfa.start(), "\xC3\xA8"), Dfa::kDead) << "è";
  EXPECT_EQ(dfa.Walk(dfa.start(), "\xED\xA0\x80"), Dfa::kDead) << "no surrogates";
  const Dfa any = Compile("[^x]");
  EXPECT_EQ(any.Walk(any.start(), "\xED\xA0"), Dfa::kDead) << "no surrogates in a complement";
  EXPECT_EQ(any.Walk(any.start(), "\xC0"), Dfa::kDead) << "no overlong encodings";
  EXPECT_TRUE(any.Matches("\xF4\x8F\xBF\xBF"));
  EXPECT_EQ(any.Walk(any.start(), "\xF4\x90"), Dfa::kDead) << "nothing past U+10FFFF";
}

// A random string: characters of the pattern and a few others, so that most patterns see
// both matches and near misses.
std::string RandomString(std::mt19937& rng, const std::string& alphabet) {
  std::string s;
  const int n = static_cast<int>(rng() % 9);
  for (int i = 0; i < n; ++i) s += alphabet[rng() % alphabet.size()];
  return s;
}

// A random string of the automaton's language (a walk that stops in an accepting state).
std::string RandomMember(std::mt19937& rng, const Dfa& dfa) {
  std::string s;
  Dfa::State st = dfa.start();
  while (s.size() < 64) {
    if (dfa.accepting(st) && rng() % 3 == 0) return s;
    std::vector<int> next;
    for (int b = 0; b < 128; ++b) {
      if (dfa.Next(st, static_cast<uint8_t>(b)) != Dfa::kDead) next.push_back(b);
    }
    if (next.empty()) break;
    const int b = next[rng() % next.size()];
    s += static_cast<char>(b);
    st = dfa.Next(st, static_cast<uint8_t>(b));
  }
  return dfa.accepting(st) ? s : std::string();
}

TEST(RegexTest, AgreesWithStdRegexOnAsciiStrings) {
  const std::vector<std::string> patterns = {
      "a(b|c)*d",
      "[0-9]{2,4}-[a-f]+",
      "(x|xy|xyz)z?",
      "\\d*\\.?\\d+",
      "(?:ab|a)(?:bc|c)",
      "[^a-c]+[a-c]",
      "(a|b)*abb",
      "\"[^\"\\\\]*\"",
      "-?(0|[1-9][0-9]*)",
      "[ \\t]*(true|false)",
      "(ab){1,3}c{0,2}",
      "[\\w.]+@[a-z]+\\.(com|org)",
      ".+x",
      "(a?){3}a{3}",
      "[-+]?[0-9]*\\.?[0-9]+([eE][-+]?[0-9]+)?",
  };
  std::mt19937 rng(11);
  int members = 0;
  for (const std::string& p : patterns) {
    const Dfa dfa = Compile(p);
    const std::regex re(p, std::regex::ECMAScript);
    std::string alphabet = p + "az09 .\"";
    for (int i = 0; i < 400; ++i) {
      const std::string s = RandomString(rng, alphabet);
      EXPECT_EQ(dfa.Matches(s), std::regex_match(s, re)) << p << " on '" << s << "'";
    }
    for (int i = 0; i < 100; ++i) {
      const std::string s = RandomMember(rng, dfa);
      if (s.empty() && !dfa.Matches(s)) continue;
      ++members;
      EXPECT_TRUE(std::regex_match(s, re)) << p << " generated '" << s << "'";
    }
  }
  EXPECT_GT(members, 1000);
}

TEST(RegexTest, RefusalsNameTheConstruct) {
  struct Bad {
    std::string pattern;
    const char* message;
  };
  for (const Bad& b : std::vector<Bad>{
           {"(a", "a '(' without its ')' at offset 2"},
           {"a)", "unmatched ')' at offset 1"},
           {"*a", "a quantifier with nothing to repeat at offset 0"},
           {"a|{2}", "a quantifier with nothing to repeat"},
           {"(?=a)b", "lookaround is not supported"},
           {"(?<!a)b", "lookaround is not supported"},
           {"(a)\\1", "backreferences are not supported"},
           {"a^b", "an anchor inside the pattern is not supported at offset 1"},
           {"(a$)", "an anchor inside the pattern"},
           {"\\bx", "word boundaries"},
           {"[z-a]", "a class range out of order"},
           {"[\\d-z]", "a class range whose end is a class escape"},
           {"\\p{L}", "Unicode property escapes"},
           {"(?i)a", "inline flags"},
           {"a{3,2}", "m < n"},
           {"a{1001}", "a repetition count above 1000"},
           {"\\q", "an unknown escape '\\q'"},
           {"\\x4", "a bad hexadecimal escape"},
           {"\\u{110000}", "past U+10FFFF"},
           {"[a", "a '[' without its ']'"},
           {"a\\", "a pattern ending in '\\'"},
           {"[]", "matches no string"},
           {"a[]b|[^\\s\\S]", "matches no string"},
       }) {
    EXPECT_THAT(CompileRegex(b.pattern).status(),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(b.message)))
        << b.pattern;
  }
  EXPECT_THAT(CompileRegex("\xFF").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not valid UTF-8")));
}

TEST(RegexTest, AutomatonSizeIsBounded) {
  // The n-th symbol from the end: 2^n deterministic states.
  EXPECT_THAT(CompileRegex("(a|b)*a(a|b){14}").status(),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("passes 10000 states")));
  EXPECT_OK(CompileRegex("(a|b)*a(a|b){8}").status());
  EXPECT_THAT(CompileRegex("(a{1000}){1000}").status(),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("too large")));
  // Construction work is bounded too: a pattern whose every state carries thousands of NFA
  // states is refused quickly, not built for minutes.
  RegexLimits quick;
  quick.max_work = 100000;
  EXPECT_THAT(CompileRegex("(.{0,300}x){3}", quick).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("too complex")));
  RegexLimits small;
  small.max_dfa_states = 4;
  EXPECT_THAT(CompileRegex("abcdef", small).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("passes 4 states")));
}

}  // namespace
}  // namespace kvserve::structured
