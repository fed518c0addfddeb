// IoTurns: a turn when a watched descriptor becomes readable, wake-ups before a turn runs make one
// turn, a turn may ask for another, the periodic tick, and Stop leaves the descriptors open.
#include "router/io_turns.h"

#include <fcntl.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>
#include <chrono>
#include <cstdint>
#include <future>
#include <thread>

#include "gtest/gtest.h"

namespace kvserve::router {
namespace {

using std::chrono::milliseconds;

// An eventfd a test signals and the turn reads back to not-readable.
struct Signal {
  int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  ~Signal() { close(fd); }
  void Raise() const {
    const uint64_t one = 1;
    ASSERT_EQ(write(fd, &one, sizeof(one)), static_cast<ssize_t>(sizeof(one)));
  }
  // Reads it; the count raised since the last read (0: none).
  [[nodiscard]] uint64_t Take() const {
    uint64_t n = 0;
    return read(fd, &n, sizeof(n)) == static_cast<ssize_t>(sizeof(n)) ? n : 0;
  }
};

class IoTurnsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    thread_ = std::thread([this] { io_.run(); });
  }
  void TearDown() override {
    work_.reset();
    io_.stop();
    thread_.join();
  }
  // Runs `f` on the io thread and waits for it.
  void OnIo(const std::function<void()>& f) {
    std::promise<void> done;
    boost::asio::post(io_, [&] {
      f();
      done.set_value();
    });
    done.get_future().wait();
  }
  static bool WaitFor(const std::function<bool()>& ok) {
    for (int i = 0; i < 500 && !ok(); ++i) std::this_thread::sleep_for(milliseconds(10));
    return ok();
  }

  boost::asio::io_context io_{1};
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_ =
      boost::asio::make_work_guard(io_);
  std::thread thread_;
};

TEST_F(IoTurnsTest, EachReadableDescriptorBringsATurnThatTakesIt) {
  Signal a, b;
  std::atomic<int> turns{0};
  std::atomic<uint64_t> taken{0};
  IoTurns t(io_, {a.fd, b.fd}, milliseconds(60000), [&] {
    ++turns;
    taken += a.Take() + b.Take();
    return false;
  });
  t.Start();
  ASSERT_TRUE(WaitFor([&] { return turns >= 1; }));  // the first turn comes unasked
  for (int i = 0; i < 20; ++i) {
    const int before = turns;
    (i % 2 == 0 ? a : b).Raise();
    ASSERT_TRUE(WaitFor([&] { return turns > before; })) << "signal " << i << " brought no turn";
  }
  EXPECT_EQ(taken.load(), 20u);
  OnIo([&] { t.Stop(); });
}

TEST_F(IoTurnsTest, WakeUpsBeforeATurnRunsMakeOneTurn) {
  Signal a, b;
  std::atomic<int> turns{0};
  IoTurns t(io_, {a.fd, b.fd}, milliseconds(60000), [&] {
    ++turns;
    (void)a.Take();
    (void)b.Take();
    return false;
  });
  t.Start();
  ASSERT_TRUE(WaitFor([&] { return turns >= 1; }));
  std::promise<void> entered, release;
  std::shared_future<void> blocked = release.get_future().share();
  const int before = turns;
  boost::asio::post(io_, [&entered, blocked] {  // the io thread is busy meanwhile
    entered.set_value();
    blocked.wait();
  });
  entered.get_future().wait();
  a.Raise();
  b.Raise();
  a.Raise();
  release.set_value();
  ASSERT_TRUE(WaitFor([&] { return turns > before; }));
  std::this_thread::sleep_for(milliseconds(100));
  EXPECT_EQ(turns - before, 1);
  OnIo([&] { t.Stop(); });
}

TEST_F(IoTurnsTest, ATurnThatAsksForAnotherGetsItWithoutAWakeUp) {
  std::atomic<int> turns{0};
  IoTurns t(io_, {}, milliseconds(60000), [&] { return ++turns < 5; });
  t.Start();
  ASSERT_TRUE(WaitFor([&] { return turns >= 5; }));
  std::this_thread::sleep_for(milliseconds(100));
  EXPECT_EQ(turns.load(), 5);
  OnIo([&] { t.Stop(); });
}

TEST_F(IoTurnsTest, IdleTurnsComeAtTheIdlePace) {
  std::atomic<int> turns{0};
  IoTurns t(io_, {}, milliseconds(20), [&] {
    ++turns;
    return false;
  });
  t.Start();
  EXPECT_TRUE(WaitFor([&] { return turns >= 6; }));  // within 5 s, whatever this machine's pace
  OnIo([&] { t.Stop(); });
}

TEST_F(IoTurnsTest, StopEndsTheTurnsAndLeavesTheDescriptorsOpen) {
  Signal a;
  std::atomic<int> turns{0};
  IoTurns t(io_, {a.fd}, milliseconds(10), [&] {
    ++turns;
    (void)a.Take();
    return false;
  });
  t.Start();
  ASSERT_TRUE(WaitFor([&] { return turns >= 1; }));
  OnIo([&] { t.Stop(); });
  const int after_stop = turns;
  a.Raise();
  std::this_thread::sleep_for(milliseconds(100));  // ten idle periods
  EXPECT_EQ(turns.load(), after_stop);
  EXPECT_NE(fcntl(a.fd, F_GETFD), -1) << "Stop closed a descriptor it did not own";
  EXPECT_EQ(a.Take(), 1u);
}

}  // namespace
}  // namespace kvserve::router
