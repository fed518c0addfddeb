#include "worker/kv_cache/kv_cache_manager.h"

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace kvserve::worker {
namespace {

// A sequence of n tokens with distinct block hashes per full block of 4.
Sequence MakeSeq(int64_t id, int n, uint64_t salt = 0) {
  Sequence s;
  s.id = id;
  for (int i = 0; i < n; ++i) s.tokens.push_back(i);
  s.num_prompt_tokens = n;
  for (int b = 0; b + 1 <= n / 4; ++b) s.block_hashes.push_back(BlockHash{salt * 100 + b + 1, 0});
  return s;
}

TEST(KvCacheManagerTest, AllocatesBlocksForComputedTokens) {
  KvCacheManager kv({.num_blocks = 8, .block_size = 4, .enable_prefix_caching = true});
  Sequence s = MakeSeq(1, 10);
  ASSERT_TRUE(kv.Allocate(s, 10, {}));
  EXPECT_EQ(s.block_table.size(), 3u);
  s.num_computed_tokens = 10;
  kv.CacheComputedBlocks(s);
  EXPECT_EQ(s.num_cached_blocks, 2);
  EXPECT_EQ(kv.pool().num_cached(), 2);
  ASSERT_TRUE(kv.Allocate(s, 2, {}));  // tokens 10, 11 fit in block 2
  EXPECT_EQ(s.block_table.size(), 3u);
  ASSERT_TRUE(kv.Allocate(s, 3, {}));  // 10..12 needs a 4th block
  EXPECT_EQ(s.block_table.size(), 4u);
  const Sequence* live[] = {&s};
  EXPECT_OK(kv.CheckInvariants(live));
  EXPECT_TRUE(kv.TakeCopies().empty());
}

TEST(KvCacheManagerTest, PrefixHitLeavesOneTokenToCompute) {
  KvCacheManager kv({.num_blocks = 8, .block_size = 4, .enable_prefix_caching = true});
  Sequence a = MakeSeq(1, 8);
  ASSERT_TRUE(kv.Allocate(a, 8, {}));
  a.num_computed_tokens = 8;
  kv.CacheComputedBlocks(a);
  kv.Free(a);
  Sequence b = MakeSeq(2, 8);  // same tokens: both blocks cached, but one token must be computed
  std::vector<CachedBlock> hit = kv.FindCachedBlocks(b);
  EXPECT_EQ(hit.size(), 1u);
  ASSERT_TRUE(kv.Allocate(b, 4, hit));
  EXPECT_EQ(b.num_computed_tokens, 4);
  EXPECT_EQ(b.block_table.size(), 2u);
  Sequence c = MakeSeq(3, 12, /*salt=*/9);  // different hashes: no hit
  EXPECT_TRUE(kv.FindCachedBlocks(c).empty());
}

TEST(KvCacheManagerTest, AllocateIsAllOrNothing) {
  KvCacheManager kv({.num_blocks = 3, .block_size = 4, .enable_prefix_caching = true});
  Sequence a = MakeSeq(1, 8), b = MakeSeq(2, 8, 1);
  ASSERT_TRUE(kv.Allocate(a, 8, {}));
  EXPECT_FALSE(kv.Allocate(b, 8, {}));
  EXPECT_TRUE(b.block_table.empty());
  EXPECT_EQ(kv.pool().num_free(), 1);
}

TEST(KvCacheManagerTest, ForkSharesAndCopiesOnWrite) {
  KvCacheManager kv({.num_blocks = 8, .block_size = 4, .enable_prefix_caching = true});
  Sequence p = MakeSeq(1, 6);
  std::vector<std::pair<int, int>> copies;
  ASSERT_TRUE(kv.Allocate(p, 6, {}));
  p.num_computed_tokens = 6;
  Sequence c = MakeSeq(2, 6);
  kv.Fork(p, c);
  EXPECT_EQ(kv.pool().ref_count(p.block_table[1]), 2);
  p.tokens.push_back(1);
  c.tokens.push_back(2);
  ASSERT_TRUE(kv.Allocate(c, 1, {}));  // writes position 6 of the shared block 1
  copies = kv.TakeCopies().device_to_device;
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].first, p.block_table[1]);
  EXPECT_EQ(copies[0].second, c.block_table[1]);
  EXPECT_EQ(kv.pool().ref_count(p.block_table[1]), 1);
  EXPECT_EQ(c.block_table[0], p.block_table[0]);  // full block still shared
  ASSERT_TRUE(kv.Allocate(p, 1, {}));             // now sole owner: no copy
  EXPECT_TRUE(kv.TakeCopies().empty());
  const Sequence* live[] = {&p, &c};
  EXPECT_OK(kv.CheckInvariants(live));
  kv.Free(p);
  kv.Free(c);
  EXPECT_EQ(kv.pool().num_free(), 8);
}

}  // namespace
}  // namespace kvserve::worker
