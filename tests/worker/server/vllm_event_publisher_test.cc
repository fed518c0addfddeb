// vLLM's KV-event publisher protocol (worker/server/vllm_event_publisher.h) with plain ZeroMQ
// peers as vLLM's consumers use them: a SUB gets [topic, seq, payload] numbered from 0; a replay
// from a sequence gets every kept batch from it on, then the end marker (a REQ socket, as in
// vLLM's example subscriber, can take only the first of those replies); a malformed
// request is ignored and the socket keeps serving; --kv-events-config refuses what it cannot
// serve, by name.
#include "worker/server/vllm_event_publisher.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "worker/server/vllm_events_config.h"

namespace kvserve::worker {
namespace {

using kvserve::testing::StatusIs;
using ::testing::HasSubstr;

std::string BigEndian(int64_t v) {
  std::string out(8, '\0');
  for (int i = 7; i >= 0; --i, v >>= 8) out[i] = static_cast<char>(v & 0xff);
  return out;
}

std::vector<std::string> Receive(zmq::socket_t& s) {
  std::vector<std::string> frames;
  zmq::message_t m;
  do {
    if (!s.recv(m)) break;
    frames.push_back(m.to_string());
  } while (m.more());
  return frames;
}

TEST(VllmEventPublisherTest, PublishesNumberedBatchesAndReplaysThem) {
  zmq::context_t ctx;
  VllmEventsConfig c;
  c.enable_kv_cache_events = true;
  c.publisher = "zmq";
  c.endpoint = "tcp://127.0.0.1:*";
  c.replay_endpoint = "tcp://127.0.0.1:*";
  c.topic = "kv";
  c.buffer_steps = 2;  // the last two batches are kept
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<VllmEventPublisher> p, VllmEventPublisher::Start(ctx, c));
  zmq::socket_t sub(ctx, zmq::socket_type::sub);
  sub.set(zmq::sockopt::subscribe, "");
  sub.set(zmq::sockopt::rcvtimeo, 5000);
  sub.connect(p->endpoint());
  // A SUB joins asynchronously: publish until the first batch arrives, then three more.
  std::vector<std::string> first;
  int64_t sent = 0;
  for (int tries = 0; first.empty() && tries < 500; ++tries) {
    p->Publish("batch" + std::to_string(sent++));
    zmq::pollitem_t item = {sub.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, std::chrono::milliseconds(20)) > 0) first = Receive(sub);
  }
  ASSERT_EQ(first.size(), 3u);
  EXPECT_EQ(first[0], "kv");
  const std::string& seq_bytes = first[1];
  int64_t seq = 0;
  for (char ch : seq_bytes) seq = (seq << 8) | static_cast<uint8_t>(ch);
  EXPECT_EQ(first[2], "batch" + std::to_string(seq)) << "seq counts batches from 0";
  for (int i = 0; i < 3; ++i) p->Publish("batch" + std::to_string(sent++));
  const std::string newest = "batch" + std::to_string(sent - 1);
  std::vector<std::string> last;
  for (int i = 0; i < 3 && (last.size() != 3 || last[2] != newest); ++i) last = Receive(sub);
  ASSERT_EQ(last.size(), 3u);
  EXPECT_EQ(last[2], newest);
  EXPECT_EQ(last[1], BigEndian(sent - 1));

  // A REQ socket (vLLM's example subscriber) takes the first reply: the oldest kept batch.
  zmq::socket_t req(ctx, zmq::socket_type::req);
  req.set(zmq::sockopt::rcvtimeo, 5000);
  req.connect(p->replay_endpoint());
  req.send(zmq::buffer(BigEndian(0)));  // from the start: only the kept two come back
  EXPECT_EQ(Receive(req),
            (std::vector<std::string>{BigEndian(sent - 2), "batch" + std::to_string(sent - 2)}));
  // A DEALER (with REQ's empty delimiter) takes them all, then the end marker.
  zmq::socket_t all(ctx, zmq::socket_type::dealer);
  all.set(zmq::sockopt::rcvtimeo, 5000);
  all.connect(p->replay_endpoint());
  all.send(zmq::const_buffer(), zmq::send_flags::sndmore);
  all.send(zmq::buffer(BigEndian(0)));
  for (int64_t s : {sent - 2, sent - 1}) {
    EXPECT_EQ(Receive(all),
              (std::vector<std::string>{"", BigEndian(s), "batch" + std::to_string(s)}));
  }
  EXPECT_EQ(Receive(all), (std::vector<std::string>{"", BigEndian(-1), ""}));

  // A DEALER with a malformed request (4 bytes) gets nothing; the socket still serves.
  zmq::socket_t dealer(ctx, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::rcvtimeo, 300);
  dealer.connect(p->replay_endpoint());
  dealer.send(zmq::const_buffer(), zmq::send_flags::sndmore);
  dealer.send(zmq::buffer(std::string("abcd")));
  zmq::message_t nothing;
  EXPECT_FALSE(dealer.recv(nothing).has_value());
  dealer.set(zmq::sockopt::rcvtimeo, 5000);
  dealer.send(zmq::const_buffer(), zmq::send_flags::sndmore);
  dealer.send(zmq::buffer(BigEndian(sent - 1)));
  EXPECT_EQ(Receive(dealer), (std::vector<std::string>{"", BigEndian(sent - 1),
                                                       "batch" + std::to_string(sent - 1)}));
  EXPECT_EQ(Receive(dealer), (std::vector<std::string>{"", BigEndian(-1), ""}));
  EXPECT_EQ(p->dropped(), 0);
  EXPECT_EQ(p->published(), sent);
}

// A concrete endpoint is connected to (vLLM's rule): the consumer binds, as llm-d's does.
TEST(VllmEventPublisherTest, ConnectsToABoundConsumer) {
  zmq::context_t ctx;
  zmq::socket_t sub(ctx, zmq::socket_type::sub);
  sub.set(zmq::sockopt::subscribe, "");
  sub.bind("tcp://127.0.0.1:*");
  VllmEventsConfig c;
  c.enable_kv_cache_events = true;
  c.publisher = "zmq";
  c.endpoint = sub.get(zmq::sockopt::last_endpoint);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<VllmEventPublisher> p, VllmEventPublisher::Start(ctx, c));
  EXPECT_EQ(p->endpoint(), c.endpoint);
  std::vector<std::string> got;
  for (int tries = 0; got.empty() && tries < 500; ++tries) {
    p->Publish("hello");
    zmq::pollitem_t item = {sub.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, std::chrono::milliseconds(20)) > 0) got = Receive(sub);
  }
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0], "") << "the default topic";
  EXPECT_EQ(got[2], "hello");
}

TEST(VllmEventPublisherTest, ConfigAsVllmSpellsIt) {
  ASSERT_OK_AND_ASSIGN(VllmEventsConfig d, ParseVllmEventsConfig("{}"));
  EXPECT_FALSE(d.publishes());
  EXPECT_EQ(d.endpoint, "tcp://*:5557");
  EXPECT_EQ(d.buffer_steps, 10000);
  EXPECT_EQ(d.hwm, 100000);
  ASSERT_OK_AND_ASSIGN(VllmEventsConfig c,
                       ParseVllmEventsConfig(R"({"enable_kv_cache_events": true, "publisher": "zmq",
        "endpoint": "tcp://127.0.0.1:5557", "replay_endpoint": "tcp://127.0.0.1:5558",
        "topic": "kv", "buffer_steps": 5, "hwm": 7, "max_queue_size": 9})"));
  EXPECT_TRUE(c.publishes());
  EXPECT_EQ(c.replay_endpoint, "tcp://127.0.0.1:5558");
  EXPECT_EQ(c.buffer_steps, 5);
  const std::pair<const char*, const char*> bad[] = {
      {R"({"snapshot_endpoint": "tcp://*:5559"})", "snapshot_endpoint is not a key"},
      {R"({"publisher": "kafka"})", "publisher 'kafka' is not served"},
      {R"({"endpoint": "udp://x:1"})", "endpoint 'udp://x:1' must be a tcp://"},
      {R"({"buffer_steps": 0})", "buffer_steps must be an integer >= 1"},
      {R"({"enable_kv_cache_events": "yes"})", "enable_kv_cache_events must be true or false"},
      {R"([1])", "must be a JSON object"},
  };
  for (const auto& [text, says] : bad) {
    EXPECT_THAT(ParseVllmEventsConfig(text),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(says)))
        << text;
  }
}

}  // namespace
}  // namespace kvserve::worker
