// The worker's reply queue over a real ROUTER/DEALER pair: replies to a reader that stops wait
// and arrive in order once it reads; a peer that is gone, or that does not read within the
// give-up time, is given up with its replies counted as dropped.
#include "worker/server/reply_queue.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "common/net/zmq_framing.h"
#include "gtest/gtest.h"
#include "kvserve/v1/kvserve.pb.h"
#include "tests/testing/status_matchers.h"

namespace kvserve::worker {
namespace {

namespace pb = ::kvserve::v1;
using Clock = ReplyQueue::Clock;

class ReplyQueueTest : public ::testing::Test {
 protected:
  void SetUp() override {
    router_.set(zmq::sockopt::router_mandatory, true);
    router_.set(zmq::sockopt::sndhwm, 4);
    router_.bind("tcp://127.0.0.1:*");
    const std::string e = router_.get(zmq::sockopt::last_endpoint);
    dealer_.set(zmq::sockopt::routing_id, "peer");
    dealer_.set(zmq::sockopt::rcvhwm, 4);
    dealer_.set(zmq::sockopt::rcvbuf, 4096);
    dealer_.connect(e);
    // The ROUTER knows a peer once it has heard from it.
    pb::AbortRequest hello;
    ASSERT_OK(SendMessage(dealer_, "", hello));
    auto m = ReceiveMessage(router_, /*with_prefix=*/true);
    ASSERT_TRUE(m.ok() && m->has_value());
  }

  static pb::GenerateResponse Reply(uint32_t seq) {
    pb::GenerateResponse r;
    r.set_request_id("r");
    r.set_seq(seq);
    r.add_token_ids(1);
    return r;
  }

  zmq::context_t ctx_;
  zmq::socket_t router_{ctx_, zmq::socket_type::router}, dealer_{ctx_, zmq::socket_type::dealer};
};

TEST_F(ReplyQueueTest, RepliesToAReaderThatStopsWaitAndArriveInOrder) {
  ReplyQueue q(&router_, nullptr, std::chrono::seconds(60));
  constexpr uint32_t kReplies = 2000;
  for (uint32_t i = 1; i <= kReplies; ++i) q.Send("peer", Reply(i));
  EXPECT_GT(q.waiting(), 0u) << "nothing had to wait: the test did not fill the queues";
  EXPECT_GT(q.waited(), 0);
  uint32_t next = 1;
  const auto give_up = Clock::now() + std::chrono::seconds(60);
  while (next <= kReplies) {
    // As the worker's loop does: flush, then wait a little for traffic.
    EXPECT_TRUE(q.Flush(Clock::now()).empty());
    ASSERT_LT(Clock::now(), give_up) << "reply " << next << " never came";
    zmq::pollitem_t item{dealer_.handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, std::chrono::milliseconds(1));
    for (;;) {
      auto m = ReceiveMessage(dealer_, false, zmq::recv_flags::dontwait);
      ASSERT_TRUE(m.ok());
      if (!m->has_value()) break;
      pb::GenerateResponse r;
      ASSERT_OK(ParseMessage(**m, &r));
      ASSERT_EQ(r.seq(), next++);
    }
  }
  EXPECT_EQ(q.waiting(), 0u);
  EXPECT_EQ(q.dropped(), 0);
}

TEST_F(ReplyQueueTest, APeerThatIsGoneOrStuckIsGivenUp) {
  ReplyQueue q(&router_, nullptr, std::chrono::milliseconds(200));
  q.Send("nobody", Reply(1));
  EXPECT_EQ(q.dropped(), 1);
  EXPECT_EQ(q.Flush(Clock::now()), std::vector<std::string>{"nobody"});

  for (uint32_t i = 1; i <= 2000 && q.waiting() == 0; ++i) q.Send("peer", Reply(i));
  ASSERT_GT(q.waiting(), 0u);
  EXPECT_TRUE(q.Flush(Clock::now()).empty()) << "given up before the give-up time";
  const size_t waiting = q.waiting();
  EXPECT_EQ(q.Flush(Clock::now() + std::chrono::milliseconds(300)),
            std::vector<std::string>{"peer"});
  EXPECT_EQ(q.waiting(), 0u);
  EXPECT_GT(q.dropped(), 1);  // what still waited (some may have gone out meanwhile)
  EXPECT_LE(q.dropped(), 1 + static_cast<int64_t>(waiting));
}

}  // namespace
}  // namespace kvserve::worker
