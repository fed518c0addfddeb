#include "worker/kv_cache/block_pool.h"

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace kvserve::worker {
namespace {

BlockHash H(uint64_t x) { return BlockHash{x, ~x}; }

TEST(BlockPoolTest, AllocateFailsWhenExhausted) {
  BlockPool pool(3);
  EXPECT_EQ(pool.Allocate(), 0);
  EXPECT_EQ(pool.Allocate(), 1);
  EXPECT_EQ(pool.Allocate(), 2);
  EXPECT_FALSE(pool.Allocate().has_value());
  EXPECT_EQ(pool.num_free(), 0);
  pool.Release(1);
  EXPECT_EQ(pool.Allocate(), 1);
  EXPECT_OK(pool.CheckInvariants({1, 1, 1}));
}

TEST(BlockPoolTest, CachedBlocksStayFindableUntilEvicted) {
  BlockPool pool(4);
  int a = *pool.Allocate(), b = *pool.Allocate();
  ASSERT_TRUE(pool.Cache(a, H(1)));
  ASSERT_TRUE(pool.Cache(b, H(2)));
  EXPECT_FALSE(pool.Cache(a, H(3)));  // already cached
  // Release a chain last-first: b goes to the tail first, so it is evicted before a... after
  // the never-used blocks, which come first.
  pool.Release(b);
  pool.Release(a);
  EXPECT_EQ(pool.num_cached_evictable(), 2);
  EXPECT_EQ(pool.Lookup(H(1)), a);
  EXPECT_EQ(pool.Allocate(), 2);  // never-used blocks first
  EXPECT_EQ(pool.Allocate(), 3);
  EXPECT_EQ(pool.Allocate(), b);  // then the tail of the chain
  EXPECT_FALSE(pool.Lookup(H(2)).has_value());
  EXPECT_EQ(pool.num_evictions(), 1);
  EXPECT_EQ(pool.Lookup(H(1)), a);
  pool.Touch(a);  // a prefix hit takes it out of the free queue
  EXPECT_EQ(pool.num_free(), 0);
  EXPECT_OK(pool.CheckInvariants({1, 1, 1, 1}));
}

TEST(BlockPoolTest, UncachedReleasesGoToTheHead) {
  BlockPool pool(3);
  int a = *pool.Allocate(), b = *pool.Allocate(), c = *pool.Allocate();
  pool.Cache(a, H(1));
  pool.Release(a);  // cached: tail
  pool.Release(b);  // uncached: head
  pool.Release(c);  // uncached: head
  EXPECT_EQ(pool.Allocate(), c);
  EXPECT_EQ(pool.Allocate(), b);
  EXPECT_EQ(pool.Allocate(), a);
}

TEST(BlockPoolTest, DuplicateHashIsNotCachedTwice) {
  BlockPool pool(2);
  int a = *pool.Allocate(), b = *pool.Allocate();
  EXPECT_TRUE(pool.Cache(a, H(7)));
  EXPECT_FALSE(pool.Cache(b, H(7)));
  EXPECT_FALSE(pool.hash(b).has_value());
  EXPECT_OK(pool.CheckInvariants({1, 1}));
  EXPECT_FALSE(pool.CheckInvariants({1, 2}).ok());  // the checker notices a wrong owner count
}

TEST(BlockPoolTest, ListenerSeesStoresAndEvictions) {
  BlockPool pool(1);
  std::vector<std::pair<uint64_t, bool>> events;
  pool.set_listener(
      [&](int, const BlockHash& h, bool stored) { events.emplace_back(h.low, stored); });
  int a = *pool.Allocate();
  pool.Cache(a, H(5));
  pool.Release(a);
  pool.Allocate();
  EXPECT_EQ(events, (std::vector<std::pair<uint64_t, bool>>{{5, true}, {5, false}}));
}

}  // namespace
}  // namespace kvserve::worker
