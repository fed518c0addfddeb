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
