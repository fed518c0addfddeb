// The core's inbox: its descriptor is readable exactly while something added with a wake waits to
// be taken, and items added before the core takes them share one wake.
#include "frontend/core/core_inbox.h"

#include <poll.h>

#include <thread>

#include "gtest/gtest.h"

namespace kvserve::frontend {
namespace {

bool Readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 1 && (p.revents & POLLIN) != 0;
}

TEST(CoreInboxTest, TheDescriptorIsReadableExactlyWhileSomethingWaits) {
  CoreInbox inbox;
  EXPECT_FALSE(Readable(inbox.fd()));
  EXPECT_TRUE(inbox.Take().jobs.empty());  // nothing came: nothing to reset
  EXPECT_FALSE(Readable(inbox.fd()));
  inbox.AddJob(std::make_shared<Job>());
  inbox.AddAbort("a");
  inbox.AddStarted("s");
  inbox.AddControl(3, kvserve::v1::CONTROL_ACTION_DRAIN);
  EXPECT_TRUE(Readable(inbox.fd()));
  CoreInbox::Taken taken = inbox.Take();
  EXPECT_EQ(taken.jobs.size(), 1u);
  EXPECT_EQ(taken.aborts, std::vector<std::string>{"a"});
  EXPECT_EQ(taken.started, std::vector<std::string>{"s"});
  EXPECT_EQ(taken.controls.size(), 1u);
  EXPECT_FALSE(Readable(inbox.fd()));  // one wake for the four
  inbox.AddAbort("b");
  EXPECT_TRUE(Readable(inbox.fd()));  // woken again after the take
  EXPECT_EQ(inbox.Take().aborts, std::vector<std::string>{"b"});
  EXPECT_FALSE(Readable(inbox.fd()));
}

// The core's own thread (RouterCore::StartOn's) queues without a wake: it runs a turn itself.
TEST(CoreInboxTest, ItemsQueuedWithoutAWakeLeaveTheDescriptorQuiet) {
  CoreInbox inbox;
  inbox.AddJob(std::make_shared<Job>(), /*wake=*/false);
  inbox.AddAbort("a", /*wake=*/false);
  EXPECT_FALSE(Readable(inbox.fd()));
  CoreInbox::Taken taken = inbox.Take();
  EXPECT_EQ(taken.jobs.size(), 1u);
  EXPECT_EQ(taken.aborts, std::vector<std::string>{"a"});
  inbox.AddAbort("b", /*wake=*/false);
  inbox.AddAbort("c");  // another thread's still wakes
  EXPECT_TRUE(Readable(inbox.fd()));
  EXPECT_EQ(inbox.Take().aborts, (std::vector<std::string>{"b", "c"}));
  EXPECT_FALSE(Readable(inbox.fd()));
}

// Producers on other threads while the core takes: every item is taken once, and the inbox
// ends neither readable with nothing queued nor queued without being readable.
TEST(CoreInboxTest, ProducersAndTheCoreNeverLoseAWake) {
  CoreInbox inbox;
  constexpr int kPerThread = 20000;
  std::vector<std::thread> producers;
  for (int t = 0; t < 3; ++t) {
    producers.emplace_back([&inbox, t] {
      for (int i = 0; i < kPerThread; ++i) inbox.AddAbort(std::to_string(t));
    });
  }
  size_t taken = 0;
  while (taken < 3 * kPerThread) {
    pollfd p{inbox.fd(), POLLIN, 0};
    ASSERT_GE(::poll(&p, 1, 10000), 1) << "items queued and no wake: " << taken << " taken";
    taken += inbox.Take().aborts.size();
  }
  for (std::thread& t : producers) t.join();
  EXPECT_EQ(taken, 3u * kPerThread);
  EXPECT_FALSE(Readable(inbox.fd()));
  EXPECT_TRUE(inbox.Take().aborts.empty());
}

}  // namespace
}  // namespace kvserve::frontend
