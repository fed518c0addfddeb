// The worker pool's framed links (WorkerPool::UseLinks): a real kvserve-worker with --link-port
// is served over its link and publishes on it; against a scripted worker, the pool leaves the
// SUB socket's topics once the link carries the stream, and a link that breaks is reported with
// its number, the DEALER and SUB carry on after it, and a later heartbeat makes a new link.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <thread>

#include "common/net/frame_link.h"
#include "gtest/gtest.h"
#include "router/worker_pool.h"
#include "tests/testing/net.h"
#include "tests/testing/paths.h"
#include "tests/testing/status_matchers.h"
#include "tests/worker/server/worker_process.h"

namespace kvserve::router {
namespace {

namespace pb = ::kvserve::v1;
using kvserve::testing::WorkerProcess;

TEST(WorkerPoolLinksTest, ARealWorkerIsServedOverItsLink) {
  ASSERT_OK_AND_ASSIGN(
      auto worker,
      WorkerProcess::Start({"--model", kvserve::testing::FixtureModel("tiny-llama3"),
                            "--max-model-len", "256", "--num-blocks", "64", "--link-port", "0"}));
  zmq::context_t ctx;
  PrefixIndex index;
  WorkerPool pool(ctx, &index, absl::Seconds(2));
  pool.UseLinks();
  const int w = pool.Add({"w0", "127.0.0.1", worker->port(), worker->events_port()});
  for (int i = 0; i < 500 && pool.link_epoch(w) == 0; ++i) pool.Poll(10);
  ASSERT_EQ(pool.link_epoch(w), 1);
  for (int i = 0; i < 500 && !pool.link_subscribed(w); ++i) pool.Poll(10);
  ASSERT_TRUE(pool.link_subscribed(w));
  std::vector<int32_t> prompt(40);
  for (int i = 0; i < 40; ++i) prompt[i] = 17 * i % 1000;
  ASSERT_OK(pool.Send(w, kvserve::testing::MakeRequest("r1", prompt, 6)));
  int tokens = 0;
  bool done = false;
  for (int i = 0; i < 1000 && !done; ++i) {
    for (auto& [from, m] : pool.Poll(10)) {
      if (m.type != "GenerateResponse") continue;  // the answer to the pool's snapshot ask
      pb::GenerateResponse r;
      ASSERT_OK(ParseMessage(m, &r));
      EXPECT_EQ(from, w);
      tokens += r.token_ids_size();
      done = r.has_usage();
    }
  }
  EXPECT_TRUE(done);
  EXPECT_EQ(tokens, 6);
  // Its KV events came on the link: the prompt's block is in the index.
  for (int i = 0; i < 100 && index.num_blocks(w) == 0; ++i) pool.Poll(10);
  EXPECT_GT(index.num_blocks(w), 0u);
  EXPECT_TRUE(pool.Views()[0].eligible);  // and its statuses
  EXPECT_TRUE(pool.TakeLostLinks().empty());
  EXPECT_EQ(pool.counters(w).links_lost, 0);
}

// A worker of ZeroMQ sockets and a link listener, driven by the test's thread.
class FakeLinkWorker {
 public:
  FakeLinkWorker() {
    pub_.bind("tcp://127.0.0.1:*");
    router_.bind("tcp://127.0.0.1:*");
    listener_ = kvserve::testing::ListenLoopback(&link_port_, /*nonblocking=*/true);
  }
  ~FakeLinkWorker() { close(listener_); }
  static int Port(zmq::socket_t& s) {
    const std::string e = s.get(zmq::sockopt::last_endpoint);
    return std::stoi(e.substr(e.rfind(':') + 1));
  }
  WorkerEndpoint endpoint() { return {"fake", "127.0.0.1", Port(router_), Port(pub_)}; }
  void Heartbeat() {
    pb::WorkerStatus st;
    st.set_instance_id(1);
    st.set_block_size(16);
    st.set_state(pb::WORKER_STATE_READY);
    st.set_link_port(link_port_);
    ASSERT_OK(SendMessage(pub_, "status", st));
  }
  // A link accepted now (null: none waiting).
  std::unique_ptr<FrameLink> Accept() {
    const int fd = accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
    return fd < 0 ? nullptr : std::make_unique<FrameLink>(fd, FrameLink::Options{});
  }
  zmq::socket_t& router() { return router_; }
  // The topics the pool's SUB socket took (on) or left (off) within a second, sorted.
  std::vector<std::string> Subscriptions(bool on) {
    std::vector<std::string> topics;
    pub_.set(zmq::sockopt::rcvtimeo, 1000);
    zmq::message_t m;
    while (topics.size() < 3 && pub_.recv(m)) {
      const std::string s = m.to_string();
      if (!s.empty() && (s[0] == 1) == on) topics.push_back(s.substr(1));
    }
    std::sort(topics.begin(), topics.end());
    return topics;
  }

 private:
  zmq::context_t ctx_;
  // XPUB: it hears the pool's subscriptions come and go.
  zmq::socket_t pub_{ctx_, zmq::socket_type::xpub}, router_{ctx_, zmq::socket_type::router};
  int listener_ = -1;
  int link_port_ = 0;
};

// Heartbeats every 20 ms and polls `pool` until `done` or 5 s pass.
template <typename Done>
bool PollUntil(WorkerPool& pool, FakeLinkWorker& fake, Done done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < deadline) {
    fake.Heartbeat();
    pool.Poll(10);
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// The messages `link` holds within a second (its hello dropped).
std::vector<ReceivedMessage> ReadLink(FrameLink& link) {
  std::vector<ReceivedMessage> got;
  for (int i = 0; i < 100 && got.empty(); ++i) {
    pollfd p{link.fd(), POLLIN, 0};
    poll(&p, 1, 10);
    EXPECT_OK(link.Read(got, 16));
    std::erase_if(got, [](const ReceivedMessage& m) { return m.type == FrameLink::kHelloType; });
  }
  return got;
}

TEST(WorkerPoolLinksTest, ABrokenLinkIsReportedTheDealerCarriesOnAndALaterHeartbeatLinksAgain) {
  FakeLinkWorker fake;
  zmq::context_t ctx;
  PrefixIndex index;
  WorkerPool pool(ctx, &index, absl::Seconds(2));
  pool.UseLinks();
  const int w = pool.Add(fake.endpoint());
  std::unique_ptr<FrameLink> link;
  ASSERT_TRUE(PollUntil(pool, fake, [&] {
    if (link == nullptr) link = fake.Accept();
    return link != nullptr && pool.link_epoch(w) == 1;
  }));
  const std::vector<std::string> topics = {"control", "kv", "status"};
  EXPECT_EQ(fake.Subscriptions(true), topics);
  std::vector<ReceivedMessage> got = ReadLink(*link);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].type, "LinkSubscribe");
  // The stream on the link: the pool leaves the SUB socket's topics.
  pb::WorkerStatus status;
  status.set_instance_id(1);
  status.set_block_size(16);
  status.set_state(pb::WORKER_STATE_READY);
  status.set_link_port(1);
  ASSERT_OK(link->Queue(status));
  ASSERT_OK(link->Flush());
  for (int i = 0; i < 100 && !pool.link_subscribed(w); ++i) pool.Poll(10);
  EXPECT_TRUE(pool.link_subscribed(w));
  EXPECT_EQ(fake.Subscriptions(false), topics);
  ASSERT_OK(pool.Send(w, kvserve::testing::MakeRequest("on-link", {1, 2, 3}, 1)));
  got = ReadLink(*link);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].type, "GenerateRequest");
  pb::GenerateResponse reply;
  reply.set_request_id("on-link");
  ASSERT_OK(link->Queue(reply));
  ASSERT_OK(link->Flush());
  std::vector<std::pair<int, ReceivedMessage>> replies;
  for (int i = 0; i < 100 && replies.empty(); ++i) replies = pool.Poll(10);
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_EQ(replies[0].second.type, "GenerateResponse");

  link.reset();  // the worker's end closes
  ASSERT_TRUE(PollUntil(pool, fake, [&] { return pool.link_epoch(w) == 0; }));
  EXPECT_EQ(pool.TakeLostLinks(), (std::vector<std::pair<int, int>>{{w, 1}}));
  EXPECT_EQ(pool.counters(w).links_lost, 1);
  EXPECT_FALSE(pool.link_subscribed(w));
  EXPECT_EQ(fake.Subscriptions(true), topics);  // the SUB socket carries the stream again
  fake.router().set(zmq::sockopt::rcvtimeo, 5000);
  ASSERT_OK(pool.Send(w, kvserve::testing::MakeRequest("on-dealer", {1, 2, 3}, 1)));
  ASSERT_OK_AND_ASSIGN(std::optional<ReceivedMessage> m, ReceiveMessage(fake.router(), true));
  ASSERT_TRUE(m.has_value());
  pb::GenerateRequest sent;
  ASSERT_OK(ParseMessage(*m, &sent));
  EXPECT_EQ(sent.request_id(), "on-dealer");

  // A second later a heartbeat links again, under a new number.
  ASSERT_TRUE(PollUntil(pool, fake, [&] {
    if (link == nullptr) link = fake.Accept();
    return link != nullptr && pool.link_epoch(w) == 2;
  }));
}

}  // namespace
}  // namespace kvserve::router
