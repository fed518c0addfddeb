#include "frontend/output/stop_strings.h"

#include <random>

#include "gtest/gtest.h"

namespace kvserve::frontend {
namespace {

// Feeds `deltas` and returns (emitted text, matched stop or "").
std::pair<std::string, std::string> Feed(std::vector<std::string> stops,
                                         const std::vector<std::string>& deltas) {
  StopStringMatcher m(std::move(stops));
  std::string out, matched;
  for (const std::string& d : deltas) {
    StopStringMatcher::Result r = m.Append(d);
    out += r.emit;
    if (r.stopped) {
      matched = r.matched;
      break;
    }
  }
  out += m.Flush();
  return {out, matched};
}

TEST(StopStringsTest, MatchesAcrossDeltasAndDropsTheStop) {
  EXPECT_EQ(Feed({"o w"}, {"Hel", "lo", " wor", "ld"}),
            std::make_pair(std::string("Hell"), std::string("o w")));
  EXPECT_EQ(Feed({"\n\n"}, {"a\n", "\nb"}), std::make_pair(std::string("a"), std::string("\n\n")));
  EXPECT_EQ(Feed({"###"}, {"no stop here ##", "# later"}).first, "no stop here ");
}

TEST(StopStringsTest, EarliestStopWinsAndHeldTextIsReleased) {
  EXPECT_EQ(Feed({"cd", "bc"}, {"abcd"}).second, "bc");
  // "ab" could start "abc" until the next delta proves otherwise.
  StopStringMatcher m({"abc"});
  EXPECT_EQ(m.Append("xab").emit, "x");
  EXPECT_EQ(m.Append("d").emit, "abd");
  EXPECT_EQ(m.Append("ab").emit, "");
  EXPECT_EQ(m.Flush(), "ab");  // end of stream: nothing stopped it
}

// Before min_tokens the text is final as it comes, held-back text included, and nothing stops.
TEST(StopStringsTest, UncheckedTextIsEmittedWhole) {
  StopStringMatcher m({"abc"});
  EXPECT_EQ(m.Append("xab").emit, "x");
  EXPECT_EQ(m.Append("cab", /*check=*/false).emit, "abcab");
  EXPECT_FALSE(m.stopped());
  const StopStringMatcher::Result r = m.Append("xabc");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.emit, "x");
}

TEST(StopStringsTest, Utf8StopsAndEmptyStopsIgnored) {
  EXPECT_EQ(Feed({"世界"}, {"你好", "世", "界！"}),
            std::make_pair(std::string("你好"), std::string("世界")));
  EXPECT_EQ(Feed({""}, {"abc"}).first, "abc");
}

TEST(StopStringsTest, RandomSplitsGiveTheSameResultAsWholeText) {
  std::mt19937 rng(5);
  const std::string alphabet = "ab c\n";
  for (int trial = 0; trial < 2000; ++trial) {
    std::string text;
    for (int i = 0; i < 30; ++i) text += alphabet[rng() % alphabet.size()];
    std::vector<std::string> stops = {"ab c", "\n\n", "cc"};
    const auto whole = Feed(stops, {text});
    std::vector<std::string> deltas;
    for (size_t i = 0; i < text.size();) {
      size_t n = 1 + rng() % 4;
      deltas.push_back(text.substr(i, n));
      i += n;
    }
    ASSERT_EQ(Feed(stops, deltas), whole) << text;
    // And the reference: cut at the earliest occurrence.
    size_t cut = std::string::npos;
    for (const auto& s : stops) cut = std::min(cut, text.find(s));
    ASSERT_EQ(whole.first, text.substr(0, cut));
  }
}

}  // namespace
}  // namespace kvserve::frontend
