// The router's book of device-to-device KV links (router/kv_links.h) against stand-in workers
// (ROUTER sockets that record what the router sends): which pairs get a link, the two-step
// open, one transfer per worker at a time, a failure closing the link at both ends with a pause
// before the next, and a restarted or incompatible worker.
#include "router/kv_links.h"

#include <set>

#include "common/net/zmq_framing.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace kvserve::router {
namespace {

namespace pb = ::kvserve::v1;
using Clock = std::chrono::steady_clock;

// A worker's ROUTER port that the pool's DEALER connects to.
struct FakeWorker {
  explicit FakeWorker(zmq::context_t& ctx) : socket(ctx, zmq::socket_type::router) {
    port = *BindTcp(socket, "127.0.0.1", 0, "fake worker");
  }
  // The next message the router sent, within a second.
  std::optional<ReceivedMessage> Next() {
    socket.set(zmq::sockopt::rcvtimeo, 1000);
    absl::StatusOr<std::optional<ReceivedMessage>> m = ReceiveMessage(socket, true);
    return m.ok() ? *m : std::nullopt;
  }
  // Nothing more arrives within 100 ms.
  bool Quiet() {
    socket.set(zmq::sockopt::rcvtimeo, 100);
    absl::StatusOr<std::optional<ReceivedMessage>> m = ReceiveMessage(socket, true);
    return m.ok() && !m->has_value();
  }
  zmq::socket_t socket;
  int port = 0;
};

class KvLinksTest : public ::testing::Test {
 protected:
  KvLinksTest() : pool_(ctx_, &index_, absl::Seconds(1)) {
    for (int i = 0; i < 4; ++i) {
      workers_.push_back(std::make_unique<FakeWorker>(ctx_));
      pool_.Add({absl::StrCat("w", i), "127.0.0.1", workers_[i]->port, 1});
    }
  }

  // Workers 0 and 1 join links and move blocks of one size; worker 2 moves another size;
  // worker 3 moves blocks of the same size over two tensor-parallel ranks.
  std::vector<WorkerView> Views(uint64_t instance_of_1 = 11) const {
    std::vector<WorkerView> v(4);
    for (int i = 0; i < 4; ++i) {
      v[i].id = i;
      v[i].kv_link = "nccl";
      v[i].kv_wire_block_bytes = i == 2 ? 2048 : 1024;
      v[i].instance_id = 10 + i;
    }
    v[3].tensor_parallel_size = 2;
    v[1].instance_id = instance_of_1;
    return v;
  }

  template <typename M>
  M Expect(int w, const std::string& type) {
    std::optional<ReceivedMessage> m = workers_[w]->Next();
    M out;
    EXPECT_TRUE(m.has_value()) << "worker " << w << " got no " << type;
    if (m) {
      EXPECT_EQ(m->type, type);
      EXPECT_OK(ParseMessage(*m, &out));
    }
    return out;
  }

  pb::KvLinkStatus Status(uint32_t id, const std::string& nccl_id, bool ready) {
    pb::KvLinkStatus s;
    s.set_link_id(id);
    s.set_nccl_id(nccl_id);
    s.set_ready(ready);
    return s;
  }

  // Opens the link between 0 and 1 as both workers would answer; returns its id.
  uint32_t OpenReady(KvLinks& links, Clock::time_point now) {
    links.Refresh(Views(), now);
    const pb::KvLinkOpen first = Expect<pb::KvLinkOpen>(0, "KvLinkOpen");
    EXPECT_EQ(first.rank(), 0u);
    links.OnStatus(0, Status(first.link_id(), "the-id", false), now);
    const pb::KvLinkOpen second = Expect<pb::KvLinkOpen>(1, "KvLinkOpen");
    EXPECT_EQ(second.rank(), 1u);
    EXPECT_EQ(second.nccl_id(), "the-id");
    EXPECT_EQ(links.Acquire(0, 1), 0u) << "not ready before both joined";
    links.OnStatus(0, Status(first.link_id(), "", true), now);
    links.OnStatus(1, Status(first.link_id(), "", true), now);
    return first.link_id();
  }

  zmq::context_t ctx_;
  PrefixIndex index_;
  WorkerPool pool_;
  std::vector<std::unique_ptr<FakeWorker>> workers_;
};

TEST_F(KvLinksTest, PairsTheCompatibleWorkersOnceAndLendsTheLinkOneTransferAtATime) {
  KvLinks links(&pool_, absl::Seconds(10));
  const Clock::time_point now = Clock::now();
  const uint32_t id = OpenReady(links, now);
  EXPECT_EQ(links.ready(), 1);
  EXPECT_TRUE(workers_[2]->Quiet()) << "worker 2 moves blocks of another size";
  EXPECT_TRUE(workers_[3]->Quiet()) << "worker 3 has another tensor-parallel size";
  links.Refresh(Views(), now);
  EXPECT_TRUE(workers_[0]->Quiet()) << "one link per pair";
  EXPECT_EQ(links.Acquire(1, 0), id);
  EXPECT_EQ(links.Acquire(0, 1), 0u) << "busy";
  links.Release(id, /*ok=*/true, now);
  EXPECT_EQ(links.Acquire(0, 1), id);
  EXPECT_EQ(links.Acquire(0, 2), 0u) << "no link between 0 and 2";
}

TEST_F(KvLinksTest, AFailedTransferClosesTheLinkAtBothEndsAndTheNextComesAfterAPause) {
  KvLinks links(&pool_, absl::Seconds(10), absl::Seconds(5));
  const Clock::time_point now = Clock::now();
  const uint32_t id = OpenReady(links, now);
  ASSERT_EQ(links.Acquire(0, 1), id);
  links.Release(id, /*ok=*/false, now);
  EXPECT_EQ(Expect<pb::KvLinkClose>(0, "KvLinkClose").link_id(), id);
  EXPECT_EQ(Expect<pb::KvLinkClose>(1, "KvLinkClose").link_id(), id);
  EXPECT_EQ(links.ready(), 0);
  EXPECT_EQ(links.Acquire(0, 1), 0u);
  links.Refresh(Views(), now + std::chrono::seconds(1));
  EXPECT_TRUE(workers_[0]->Quiet()) << "within the pause";
  links.Refresh(Views(), now + std::chrono::seconds(6));
  EXPECT_GT(Expect<pb::KvLinkOpen>(0, "KvLinkOpen").link_id(), id);
}

TEST_F(KvLinksTest, AWorkersErrorOrRestartEndsItsLink) {
  KvLinks links(&pool_, absl::Seconds(10), absl::Seconds(5));
  const Clock::time_point now = Clock::now();
  uint32_t id = OpenReady(links, now);
  links.Refresh(Views(/*instance_of_1=*/99), now);  // worker 1 restarted
  EXPECT_EQ(Expect<pb::KvLinkClose>(0, "KvLinkClose").link_id(), id);
  EXPECT_EQ(Expect<pb::KvLinkClose>(1, "KvLinkClose").link_id(), id);
  EXPECT_EQ(links.ready(), 0);

  // A join that fails at one end closes the link too.
  links.Refresh(Views(), now + std::chrono::seconds(6));
  const pb::KvLinkOpen open = Expect<pb::KvLinkOpen>(0, "KvLinkOpen");
  pb::KvLinkStatus failed;
  failed.set_link_id(open.link_id());
  failed.mutable_error()->set_code(14);
  failed.mutable_error()->set_message("the NCCL link's peer did not join");
  links.OnStatus(0, failed, now + std::chrono::seconds(6));
  EXPECT_EQ(Expect<pb::KvLinkClose>(0, "KvLinkClose").link_id(), open.link_id());
  EXPECT_EQ(links.ready(), 0);
}

}  // namespace
}  // namespace kvserve::router
