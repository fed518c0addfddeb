#include "common/utf8.h"

#include "gtest/gtest.h"

namespace kvserve {
namespace {

TEST(Utf8Test, Validity) {
  EXPECT_TRUE(IsValidUtf8(""));
  EXPECT_TRUE(IsValidUtf8("héllo 世界 😀"));
  EXPECT_FALSE(IsValidUtf8("\xc3"));              // truncated
  EXPECT_FALSE(IsValidUtf8("\xc0\xaf"));          // overlong
  EXPECT_FALSE(IsValidUtf8("\xed\xa0\x80"));      // surrogate
  EXPECT_FALSE(IsValidUtf8("\xf4\x90\x80\x80"));  // past U+10FFFF
  EXPECT_FALSE(IsValidUtf8("\x80"));
}

TEST(Utf8Test, EncodesEveryLengthAtItsBoundaries) {
  const std::pair<char32_t, std::string> cases[] = {
      {U'\0', std::string(1, '\0')},
      {0x7F, "\x7f"},
      {0x80, "\xc2\x80"},
      {0x7FF, "\xdf\xbf"},
      {0x800, "\xe0\xa0\x80"},
      {0xFFFF, "\xef\xbf\xbf"},
      {0x10000, "\xf0\x90\x80\x80"},
      {0x10FFFF, "\xf4\x8f\xbf\xbf"},
      {U'é', "é"},
  };
  for (const auto& [c, want] : cases) {
    std::string got = "x";
    AppendUtf8(c, got);
    EXPECT_EQ(got, "x" + want) << static_cast<uint32_t>(c);
  }
  // Every scalar value round-trips through the decoder's view of validity.
  for (char32_t c = 0; c <= 0x10FFFF; c += (c < 0x10000 ? 1 : 97)) {
    if (c >= 0xD800 && c <= 0xDFFF) continue;
    char bytes[4];
    const int n = EncodeUtf8(c, bytes);
    ASSERT_EQ(Utf8SequenceLength(std::string_view(bytes, n), 0), static_cast<size_t>(n))
        << static_cast<uint32_t>(c);
  }
}

TEST(Utf8Test, CompletePrefixHoldsBackOnlyUnfinishedSequences) {
  EXPECT_EQ(CompleteUtf8Prefix("abc"), 3u);
  EXPECT_EQ(CompleteUtf8Prefix("ab\xe4\xb8"), 2u);      // 世 missing its last byte
  EXPECT_EQ(CompleteUtf8Prefix("ab\xf0\x9f\x98"), 2u);  // 😀 missing one byte
  EXPECT_EQ(CompleteUtf8Prefix("ab\xf0"), 2u);
  EXPECT_EQ(CompleteUtf8Prefix("ab\xe4\xb8\x96"), 5u);
  EXPECT_EQ(CompleteUtf8Prefix("ab\xff"), 3u);      // invalid: emitted (as U+FFFD)
  EXPECT_EQ(CompleteUtf8Prefix("ab\xe4\x41"), 4u);  // cannot complete any more
  EXPECT_EQ(CompleteUtf8Prefix("\x80\x80\x80\x80"), 4u);
}

TEST(Utf8Test, LossyReplacesMaximalInvalidSubsequences) {
  EXPECT_EQ(Utf8Lossy("a\xe4\xb8"
                      "b"),
            "a\xEF\xBF\xBD"
            "b");
  EXPECT_EQ(Utf8Lossy("\xff\xfe"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(Utf8Lossy("\xf0\x9f\x98\x80"), "\xf0\x9f\x98\x80");
  EXPECT_EQ(Utf8Lossy("\xed\xa0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // as Python does
}

}  // namespace
}  // namespace kvserve
