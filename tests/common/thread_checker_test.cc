#include "common/thread_checker.h"

#include <thread>

#include "gtest/gtest.h"

namespace kvserve {
namespace {

// A class shaped as the checker's users are: an entry point that checks, state guarded by it.
class Counter {
 public:
  void Add() {
    KVSERVE_CHECK_THREAD(owner_);
    ++count_;
  }
  void HandOver() { owner_.Detach(); }
  [[nodiscard]] const ThreadChecker& owner() const { return owner_; }

 private:
  ThreadChecker owner_{"counter"};
  int count_ ABSL_GUARDED_BY(owner_) = 0;
};

TEST(ThreadCheckerTest, TheFirstThreadToCheckOwnsIt) {
  Counter c;
  EXPECT_TRUE(c.owner().CalledOnOwner());  // unbound: anyone may
  c.Add();
  c.Add();
  bool other = true;
  std::thread([&] { other = c.owner().CalledOnOwner(); }).join();
  EXPECT_FALSE(other);
  EXPECT_TRUE(c.owner().CalledOnOwner());
}

TEST(ThreadCheckerTest, DetachHandsTheStateToTheNextThread) {
  Counter c;
  c.Add();
  c.HandOver();
  std::thread([&] { c.Add(); }).join();  // binds the new thread: no crash
  EXPECT_FALSE(c.owner().CalledOnOwner());
}

#if KVSERVE_THREAD_CHECKS
TEST(ThreadCheckerDeathTest, AnotherThreadCrashesNamingTheOwner) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        Counter c;
        c.Add();
        std::thread([&] { c.Add(); }).join();
      },
      "state owned by the counter thread used on another thread");
}
#else
TEST(ThreadCheckerDeathTest, AnotherThreadCrashesNamingTheOwner) {
  GTEST_SKIP() << "built without KVSERVE_THREAD_CHECKS";
}
#endif

}  // namespace
}  // namespace kvserve
