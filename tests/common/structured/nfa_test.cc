// The Thompson construction and the subset construction (common/structured/nfa.h): code point
// sets as UTF-8 byte sequences, the operators against std::regex on every short string, the
// limits, Repeat, and calls kept as edges for grammars.
#include "common/structured/nfa.h"

#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/utf8.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace kvserve::structured {
namespace {

std::string Utf8(char32_t c) {
  std::string s;
  AppendUtf8(c, s);
  return s;
}

TEST(NfaTest, NormalizeAndComplement) {
  EXPECT_EQ(Normalize({{5, 9}, {1, 2}, {3, 4}, {8, 12}}), (CodePointSet{{1, 12}}));
  EXPECT_EQ(Normalize({{10, 20}, {1, 2}}), (CodePointSet{{1, 2}, {10, 20}}));
  // The surrogates stay in the set; CodePoints leaves them out when it encodes (below).
  EXPECT_EQ(Complement({{'a', 'z'}}), (CodePointSet{{0, 'a' - 1}, {'z' + 1, kMaxCodePoint}}));
  EXPECT_EQ(Complement({}), (CodePointSet{{0, kMaxCodePoint}}));
  EXPECT_EQ(Complement({{0, kMaxCodePoint}}), CodePointSet{});
}

// A set of code points matches exactly the UTF-8 encodings of its members: checked at every
// length boundary, inside and just outside the set, and never a surrogate or a stray byte.
TEST(NfaTest, CodePointsMatchTheirUtf8EncodingsExactly) {
  const CodePointSet set = {{'0', '9'}, {0x7F, 0x81}, {0x7FF, 0x800}, {0xD000, 0x10001}};
  Nfa nfa;
  ASSERT_OK_AND_ASSIGN(Dfa dfa, nfa.ToDfa(nfa.CodePoints(set), 10000));
  const auto in_set = [&](char32_t c) {
    for (const auto& [lo, hi] : set) {
      if (c >= lo && c <= hi) return c < 0xD800 || c > 0xDFFF;
    }
    return false;
  };
  for (char32_t c : {U'0',
                     U'9',
                     U'/',
                     U':',
                     char32_t{0x7E},
                     char32_t{0x7F},
                     char32_t{0x81},
                     char32_t{0x82},
                     char32_t{0x7FE},
                     char32_t{0x7FF},
                     char32_t{0x800},
                     char32_t{0x801},
                     char32_t{0xCFFF},
                     char32_t{0xD000},
                     char32_t{0xD7FF},
                     char32_t{0xE000},
                     char32_t{0xFFFF},
                     char32_t{0x10000},
                     char32_t{0x10001},
                     char32_t{0x10002},
                     char32_t{0x10FFFF}}) {
    EXPECT_EQ(dfa.Matches(Utf8(c)), in_set(c)) << std::hex << static_cast<uint32_t>(c);
  }
  EXPECT_FALSE(dfa.Matches("\xed\xa0\x80"));  // U+D800 as if encodable
  EXPECT_FALSE(dfa.Matches("\xc1\xbf"));      // U+007F, overlong
  EXPECT_FALSE(dfa.Matches("\x80"));
  // A character's first bytes keep the automaton alive; a wrong continuation kills it.
  EXPECT_NE(dfa.Walk(dfa.start(), "\xf0\x90"), Dfa::kDead);
  EXPECT_EQ(dfa.Walk(dfa.start(), "\xf0\x90\x80\x82"), Dfa::kDead);
}

constexpr size_t kMaxLength = 6;
using Language = std::set<std::string>;  // the strings of at most kMaxLength bytes

Language Concat(const Language& x, const Language& y) {
  Language out;
  for (const std::string& u : x) {
    for (const std::string& v : y) {
      if (u.size() + v.size() <= kMaxLength) out.insert(u + v);
    }
  }
  return out;
}

Language Star(const Language& x) {
  Language out = {""};
  for (Language more = out;;) {  // grows until no string of the bounded length is new
    Language next = Concat(more, x);
    Language added;
    for (const std::string& s : next) {
      if (out.insert(s).second) added.insert(s);
    }
    if (added.empty()) return out;
    more = std::move(added);
  }
}

// A random expression over {a, b}, built twice: as NFA fragments, and as the set of its
// strings up to kMaxLength computed directly from the operators' definitions.
struct Expr {
  Nfa::Fragment fragment;
  Language strings;
};

Expr RandomExpr(Nfa& nfa, std::mt19937& rng, int depth) {
  const int op = depth <= 0 ? static_cast<int>(rng() % 3) : static_cast<int>(rng() % 9);
  switch (op) {
    case 0:
      return {nfa.Literal("a"), {"a"}};
    case 1:
      return {nfa.Literal("b"), {"b"}};
    case 2:
      return {nfa.Empty(), {""}};
    case 3: {
      Expr x = RandomExpr(nfa, rng, depth - 1);
      return {nfa.Star(x.fragment), Star(x.strings)};
    }
    case 4: {
      Expr x = RandomExpr(nfa, rng, depth - 1);
      return {nfa.Plus(x.fragment), Concat(x.strings, Star(x.strings))};
    }
    case 5: {
      Expr x = RandomExpr(nfa, rng, depth - 1);
      x.strings.insert("");
      return {nfa.Optional(x.fragment), x.strings};
    }
    case 6: {
      Expr x = RandomExpr(nfa, rng, depth - 1), y = RandomExpr(nfa, rng, depth - 1);
      x.strings.insert(y.strings.begin(), y.strings.end());
      return {nfa.Alternate(x.fragment, y.fragment), x.strings};
    }
    default: {
      Expr x = RandomExpr(nfa, rng, depth - 1), y = RandomExpr(nfa, rng, depth - 1);
      return {nfa.Concat(x.fragment, y.fragment), Concat(x.strings, y.strings)};
    }
  }
}

TEST(NfaTest, OperatorsAgreeWithTheirDefinitionsOnEveryShortString) {
  std::vector<std::string> strings = {""};
  for (size_t i = 0; i < strings.size() && strings.back().size() < kMaxLength; ++i) {
    strings.push_back(strings[i] + "a");
    strings.push_back(strings[i] + "b");
  }
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    Nfa nfa;
    const Expr e = RandomExpr(nfa, rng, 4);
    if (e.strings.empty()) continue;  // cannot happen without Nothing(), but ToDfa refuses it
    ASSERT_OK_AND_ASSIGN(Dfa dfa, nfa.ToDfa(e.fragment, 10000));
    for (const std::string& s : strings) {
      ASSERT_EQ(dfa.Matches(s), e.strings.count(s) > 0) << "trial " << trial << " on '" << s << "'";
    }
  }
}

TEST(NfaTest, TheDfaKeepsOnlyStatesThatCanStillAccept) {
  Nfa nfa;
  ASSERT_OK_AND_ASSIGN(Dfa dfa,
                       nfa.ToDfa(nfa.Alternate(nfa.Literal("ab"), nfa.Literal("ac")), 100));
  EXPECT_EQ(dfa.Walk(dfa.start(), "b"), Dfa::kDead);  // dead at once, not a trap state later
  EXPECT_NE(dfa.Walk(dfa.start(), "a"), Dfa::kDead);
  EXPECT_EQ(dfa.Walk(dfa.start(), "ad"), Dfa::kDead);
  // Every state can still reach acceptance: no trap state is kept.
  for (Dfa::State st = 0; st < dfa.num_states(); ++st) {
    bool alive = dfa.accepting(st);
    for (const char* rest : {"b", "c", "ab", "ac"}) {
      const Dfa::State end = dfa.Walk(st, rest);
      alive = alive || (end != Dfa::kDead && dfa.accepting(end));
    }
    EXPECT_TRUE(alive) << st;
  }
}

TEST(NfaTest, EmptyLanguagesAndLimitsAreRefused) {
  {
    Nfa nfa;
    const absl::Status s = nfa.ToDfa(nfa.Concat(nfa.Literal("a"), nfa.Nothing()), 100).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  }
  {
    Nfa nfa;
    const absl::Status s = nfa.ToDfa(nfa.CodePoints({}), 100).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  }
  {  // (a|b)*a(a|b){12}: the subset construction needs 2^13 states
    Nfa nfa;
    const auto ab = [&] { return nfa.Alternate(nfa.Literal("a"), nfa.Literal("b")); };
    Nfa::Fragment f = nfa.Concat(nfa.Star(ab()), nfa.Literal("a"));
    for (int i = 0; i < 12; ++i) f = nfa.Concat(f, ab());
    EXPECT_EQ(nfa.ToDfa(f, 1000).status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_EQ(nfa.ToDfa(f, 100000, /*max_work=*/1000).status().code(),
              absl::StatusCode::kResourceExhausted);
  }
  {
    Nfa nfa(/*max_states=*/10);
    const Nfa::Fragment f = nfa.Literal("a long literal past ten states");
    EXPECT_TRUE(nfa.too_large());
    EXPECT_EQ(nfa.ToDfa(f, 1000).status().code(), absl::StatusCode::kResourceExhausted);
  }
}

TEST(NfaTest, RepeatCountsAsRegexBracesDo) {
  for (auto [min, max] : {std::pair<int64_t, int64_t>{0, 0}, {2, 2}, {1, 3}, {2, -1}, {0, -1}}) {
    Nfa nfa;
    ASSERT_OK_AND_ASSIGN(
        Nfa::Fragment f,
        Repeat(
            nfa, [&]() -> absl::StatusOr<Nfa::Fragment> { return nfa.Literal("ab"); }, min, max));
    ASSERT_OK_AND_ASSIGN(Dfa dfa, nfa.ToDfa(f, 1000));
    for (int64_t n = 0; n <= 6; ++n) {
      std::string s;
      for (int64_t i = 0; i < n; ++i) s += "ab";
      const bool want = n >= min && (max < 0 || n <= max);
      EXPECT_EQ(dfa.Matches(s), want) << min << ".." << max << " n=" << n;
    }
  }
  Nfa nfa;
  const absl::Status refused =
      Repeat(
          nfa, []() -> absl::StatusOr<Nfa::Fragment> { return absl::InvalidArgumentError("x"); }, 1,
          2)
          .status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
}

// A call is an edge of its own in a rule's automaton: the bytes around it move as usual.
TEST(NfaTest, CallsStayEdgesInRuleDfas) {
  Nfa nfa;
  const Nfa::Fragment f =
      nfa.Concat(nfa.Literal("["), nfa.Concat(nfa.Optional(nfa.Call(3)), nfa.Literal("]")));
  ASSERT_OK_AND_ASSIGN(RuleDfa rule, nfa.ToRuleDfa(f, 100));
  const Dfa& dfa = rule.dfa;
  const Dfa::State open = dfa.Walk(dfa.start(), "[");
  ASSERT_NE(open, Dfa::kDead);
  ASSERT_EQ(rule.calls[open].size(), 1u);
  EXPECT_EQ(rule.calls[open][0].rule, 3);
  const Dfa::State after_call = rule.calls[open][0].to;
  EXPECT_TRUE(dfa.accepting(dfa.Walk(after_call, "]")));
  EXPECT_TRUE(dfa.Matches("[]"));  // the call was optional
  EXPECT_TRUE(rule.calls[dfa.start()].empty());
}

}  // namespace
}  // namespace kvserve::structured
