#include "kernels/cpu/gloo_communicator.h"

#include <chrono>
#include <thread>

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace kvserve::kernels {
namespace {

using ::kvserve::testing::StatusIs;

// Runs fn(rank) on `size` threads and joins them.
template <typename Fn>
void OnRanks(int size, Fn fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) threads.emplace_back([&, r] { fn(r); });
  for (auto& t : threads) t.join();
}

TEST(GlooCommunicatorTest, CollectivesOnFourRanks) {
  ASSERT_OK_AND_ASSIGN(auto comms, CreateGlooGroup(4, absl::Seconds(20)));
  OnRanks(4, [&](int r) {
    Communicator& c = *comms[r];
    EXPECT_EQ(c.rank(), r);
    std::vector<float> x = {1.0f * r, 2.0f, -1.0f * r};
    EXPECT_OK(c.AllReduceSum(x.data(), x.size()));
    EXPECT_EQ(x, (std::vector<float>{6.0f, 8.0f, -6.0f}));
    std::vector<float> mine = {10.0f * r, 10.0f * r + 1}, all(8);
    EXPECT_OK(c.AllGather(mine.data(), 2, all.data()));
    EXPECT_EQ(all, (std::vector<float>{0, 1, 10, 11, 20, 21, 30, 31}));
    std::vector<float> b = {r == 2 ? 7.0f : 0.0f};
    EXPECT_OK(c.Broadcast(b.data(), 1, 2));
    EXPECT_EQ(b[0], 7.0f);
    EXPECT_OK(c.Barrier());
  });
}

TEST(GlooCommunicatorTest, AMissingPeerTimesOutInsteadOfHanging) {
  ASSERT_OK_AND_ASSIGN(auto comms, CreateGlooGroup(2, absl::Milliseconds(500)));
  const auto start = std::chrono::steady_clock::now();
  std::vector<float> x(4, 1.0f);
  absl::Status s = comms[0]->AllReduceSum(x.data(), x.size());  // rank 1 never joins
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(absl::IsDeadlineExceeded(s) || absl::IsUnavailable(s)) << s;
  EXPECT_LT(seconds, 10.0);
}

}  // namespace
}  // namespace kvserve::kernels
