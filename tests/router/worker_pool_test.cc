// The router's worker pool against real kvserve-worker processes: heartbeats make workers
// eligible, KV events put a served prompt's blocks in the prefix index under the hashes the
// router computes itself from the worker's advertised cache key (the block-hash contract,
// end to end), prefix routing then picks that worker, and a stopped worker drops out.
#include "router/worker_pool.h"

#include <chrono>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "router/policies/factory.h"
#include "tests/testing/paths.h"
#include "tests/testing/status_matchers.h"
#include "tests/worker/server/worker_process.h"

namespace kvserve::router {
namespace {

namespace pb = ::kvserve::v1;
using kvserve::testing::StatusIs;
using kvserve::testing::WorkerProcess;
using ::testing::HasSubstr;

TEST(WorkerPoolTest, EventsFeedTheIndexWithTheRoutersOwnHashes) {
  const std::vector<std::string> args = {"--model",
                                         kvserve::testing::FixtureModel("tiny-llama3"),
                                         "--max-model-len",
                                         "256",
                                         "--num-blocks",
                                         "64",
                                         "--served-model-name",
                                         "tiny"};
  ASSERT_OK_AND_ASSIGN(auto w0, WorkerProcess::Start(args));
  ASSERT_OK_AND_ASSIGN(auto w1, WorkerProcess::Start(args));
  zmq::context_t ctx;
  PrefixIndex index;
  WorkerPool pool(ctx, &index, absl::Milliseconds(1500));
  const int a = pool.Add({"w0", "127.0.0.1", w0->port(), w0->events_port()});
  const int b = pool.Add({"w1", "127.0.0.1", w1->port(), w1->events_port()});
  auto both_ready = [&] {
    auto v = pool.Views();
    return v.size() == 2 && v[0].eligible && v[1].eligible;
  };
  for (int i = 0; i < 200 && !both_ready(); ++i) pool.Poll(10);
  ASSERT_TRUE(both_ready());

  std::vector<int32_t> prompt(40);
  for (int i = 0; i < 40; ++i) prompt[i] = 17 * i % 1000;
  ASSERT_OK_AND_ASSIGN(std::string key, pool.ExtraKey(a, ""));
  const std::vector<uint32_t> ids(prompt.begin(), prompt.end());
  const std::vector<BlockHash> hashes = HashFullBlocks(ids, pool.status(a)->block_size(), key);
  ASSERT_EQ(hashes.size(), 2u);

  pb::GenerateRequest req = kvserve::testing::MakeRequest("r1", prompt, 4);
  ASSERT_OK(pool.Send(a, req));
  bool done = false;
  for (int i = 0; i < 500 && !done; ++i) {
    for (auto& [w, m] : pool.Poll(10)) {
      pb::GenerateResponse r;
      if (ParseMessage(m, &r).ok() && r.has_usage()) done = true;
    }
  }
  ASSERT_TRUE(done);
  for (int i = 0; i < 20; ++i) pool.Poll(10);  // the batch that stored the blocks
  EXPECT_EQ(index.LongestPrefix(a, hashes).device_blocks, 2);
  EXPECT_EQ(index.LongestPrefix(b, hashes).total(), 0);
  EXPECT_TRUE(index.synced(a));

  ASSERT_OK_AND_ASSIGN(std::unique_ptr<RoutingPolicy> policy, MakeRoutingPolicy({}));
  ASSERT_OK_AND_ASSIGN(
      Decision d, Route(*policy, pool.Views(), index,
                        {.hashes = hashes, .prompt_tokens = static_cast<int64_t>(ids.size())}));
  EXPECT_EQ(d.worker, a);
  EXPECT_EQ(d.predicted_cached_blocks, 2);

  // A different cache salt hashes differently: no hit anywhere.
  ASSERT_OK_AND_ASSIGN(std::string salted, pool.ExtraKey(a, "tenant"));
  EXPECT_EQ(index.LongestPrefix(a, HashFullBlocks(ids, 16, salted)).total(), 0);

  EXPECT_EQ(w1->Terminate(), 0);
  // Its heartbeats stop: after the timeout it is no longer eligible; w0 stays.
  std::vector<WorkerView> views = pool.Views();
  for (int i = 0; i < 1000 && views[b].eligible; ++i) {
    pool.Poll(10);
    views = pool.Views();
  }
  EXPECT_FALSE(views[b].eligible);
  for (int i = 0; i < 500 && !views[a].eligible; ++i) {
    pool.Poll(10);
    views = pool.Views();
  }
  EXPECT_TRUE(views[a].eligible);
  // Subscribing after a worker's first batch is a gap, resolved by a snapshot.
  EXPECT_GE(pool.counters().snapshots, std::min<int64_t>(pool.counters().gaps, 1));
  EXPECT_EQ(w0->Terminate(), 0);
}

// A worker's two sockets on loopback, driven by the test itself.
struct FakeWorker {
  explicit FakeWorker(zmq::context_t& ctx)
      : pub(ctx, zmq::socket_type::pub), router(ctx, zmq::socket_type::router) {
    pub.bind("tcp://127.0.0.1:*");
    router.bind("tcp://127.0.0.1:*");
  }
  static int Port(zmq::socket_t& s) {
    const std::string e = s.get(zmq::sockopt::last_endpoint);
    return std::stoi(e.substr(e.rfind(':') + 1));
  }
  int AddTo(WorkerPool& pool) { return pool.Add({"fake", "127.0.0.1", Port(router), Port(pub)}); }
  // A READY heartbeat of model "tiny".
  static pb::WorkerStatus Status(int block_size) {
    pb::WorkerStatus st;
    st.set_state(pb::WORKER_STATE_READY);
    st.set_model_id("tiny");
    st.set_block_size(block_size);
    return st;
  }
  zmq::socket_t pub, router;
};

// A peer on a worker's ports that sends impossible heartbeats (block_size -1 used to reach a
// CHECK in the block hash and abort the router) or unknown messages: each is dropped and
// counted, the worker stays out of rotation until a sane heartbeat comes.
TEST(WorkerPoolTest, ImpossibleHeartbeatsAreDroppedAndCounted) {
  zmq::context_t ctx;
  FakeWorker fake(ctx);
  zmq::socket_t& pub = fake.pub;
  PrefixIndex index;
  WorkerPool pool(ctx, &index, absl::Seconds(5));
  const int w = fake.AddTo(pool);
  pb::WorkerStatus st = FakeWorker::Status(-1);
  for (int i = 0; i < 300 && pool.counters(w).dropped < 3; ++i) {
    ASSERT_OK(SendMessage(pub, "status", st));
    ASSERT_OK(SendFrames(pub, {"status", "Nonsense", "x"}));
    pool.Poll(10);
  }
  EXPECT_GE(pool.counters(w).dropped, 3);
  EXPECT_EQ(pool.status(w), nullptr);
  EXPECT_FALSE(pool.Views()[w].eligible);
  st.set_block_size(16);
  for (int i = 0; i < 300 && !pool.Views()[w].eligible; ++i) {
    ASSERT_OK(SendMessage(pub, "status", st));
    pool.Poll(10);
  }
  EXPECT_TRUE(pool.Views()[w].eligible);
  EXPECT_EQ(pool.status(w)->block_size(), 16);
}

// A router out of sockets (ZeroMQ's limit a context here; the open-file limit in a large fleet)
// keeps serving the workers it could connect: the one it could not is counted, refused by name,
// never eligible, and no turn spins on it. (Making its third socket threw out of Add, which
// ended the router.)
TEST(WorkerPoolTest, AWorkerWhoseSocketsCannotBeMadeIsRefusedNotFatal) {
  zmq::context_t ctx;
  ASSERT_EQ(zmq_ctx_set(ctx.handle(), ZMQ_MAX_SOCKETS, 4), 0);  // sized at the first socket
  FakeWorker fake(ctx);                                         // two sockets
  PrefixIndex index;
  WorkerPool pool(ctx, &index, absl::Seconds(5));
  const int w = fake.AddTo(pool);  // two more: the limit
  const int lost = pool.Add({"lost-worker", "127.0.0.1", 1, 2});
  EXPECT_EQ(pool.counters(w).connect_failures, 0);
  EXPECT_EQ(pool.counters(lost).connect_failures, 1);
  EXPECT_THAT(pool.Send(lost, pb::Control()),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("lost-worker")));
  pool.Poll(0);
  EXPECT_FALSE(pool.unread());
  const pb::WorkerStatus st = FakeWorker::Status(16);
  for (int i = 0; i < 300 && !pool.Views()[w].eligible; ++i) {
    ASSERT_OK(SendMessage(fake.pub, "status", st));
    pool.Poll(10);
  }
  EXPECT_TRUE(pool.Views()[w].eligible);
  EXPECT_FALSE(pool.Views()[lost].eligible);
  EXPECT_OK(pool.Send(w, pb::Control()));
}

// A router that starts after a worker published its events (and the worker is idle now) asks
// for a snapshot from the heartbeat that reports batches it never saw, instead of waiting for
// the worker's next change; a worker that has published nothing is not asked.
TEST(WorkerPoolTest, AHeartbeatReportingUnseenBatchesAsksForASnapshot) {
  zmq::context_t ctx;
  FakeWorker fake(ctx);
  zmq::socket_t &pub = fake.pub, &router = fake.router;
  PrefixIndex index;
  WorkerPool pool(ctx, &index, absl::Seconds(5));
  const int w = fake.AddTo(pool);
  pb::WorkerStatus st = FakeWorker::Status(16);
  st.set_instance_id(7);
  // Whether the pool sent the fake worker a snapshot request within `rounds` heartbeats.
  auto asked = [&](int rounds) {
    for (int i = 0; i < rounds; ++i) {
      EXPECT_OK(SendMessage(pub, "status", st));
      pool.Poll(10);
      absl::StatusOr<std::optional<ReceivedMessage>> m =
          ReceiveMessage(router, /*with_prefix=*/true, zmq::recv_flags::dontwait);
      pb::Control c;
      if (m.ok() && m->has_value() && ParseMessage(**m, &c).ok() &&
          c.action() == pb::CONTROL_ACTION_SNAPSHOT_REQUEST) {
        return true;
      }
    }
    return false;
  };
  st.set_kv_event_seq(0);
  EXPECT_FALSE(asked(50));
  st.set_kv_event_seq(12);
  EXPECT_TRUE(asked(300));
  // Its snapshot syncs the index: no more asking.
  pb::KvSnapshot snap;
  snap.set_instance_id(7);
  snap.set_seq(12);
  for (int i = 0; i < 300 && !index.synced(w); ++i) {
    ASSERT_OK(SendMessage(pub, "kv", snap));
    pool.Poll(10);
  }
  ASSERT_TRUE(index.synced(w));
  EXPECT_FALSE(asked(50));
}

// A restarted router hears many workers' snapshots at once: they are built on several threads,
// and each worker's messages still apply in the order it sent them: a batch right after its
// snapshot applies on top of it (were it handled before the snapshot, it would be refused as a
// stream awaiting one), and a malformed snapshot is dropped and counted, its worker unsynced.
TEST(WorkerPoolTest, SnapshotsArrivingTogetherApplyInEachWorkersOrder) {
  zmq::context_t ctx;
  constexpr int kFakes = 6;
  std::vector<std::unique_ptr<FakeWorker>> fakes;
  PrefixIndex index;
  WorkerPool pool(ctx, &index, absl::Seconds(5));
  std::vector<int> ids;
  for (int i = 0; i < kFakes; ++i) {
    fakes.push_back(std::make_unique<FakeWorker>(ctx));
    ids.push_back(fakes.back()->AddTo(pool));
  }
  // Heartbeats until every subscription is up (a PUB drops what it sends before that).
  auto all_heard = [&] {
    for (int w : ids) {
      if (pool.status(w) == nullptr) return false;
    }
    return true;
  };
  for (int round = 0; round < 300 && !all_heard(); ++round) {
    for (auto& f : fakes) ASSERT_OK(SendMessage(f->pub, "status", FakeWorker::Status(16)));
    pool.Poll(10);
  }
  ASSERT_TRUE(all_heard());
  std::vector<std::vector<BlockHash>> held(kFakes), later(kFakes);
  for (int i = 0; i < kFakes; ++i) {
    std::vector<uint32_t> tokens(16 * 40);
    for (size_t t = 0; t < tokens.size(); ++t) tokens[t] = static_cast<uint32_t>(t + 1000 * i);
    const std::vector<BlockHash> chain = HashFullBlocks(tokens, 16, "k");
    held[i].assign(chain.begin(), chain.begin() + 30);
    later[i].assign(chain.begin() + 30, chain.end());
    pb::KvSnapshot snap;
    snap.set_instance_id(50 + i);
    snap.set_seq(9);
    for (const BlockHash& h : held[i]) {
      pb::CachedBlock* b = snap.add_blocks();
      b->set_block_hash(h.ToBytes());
      b->set_medium(pb::MEDIUM_DEVICE);
    }
    pb::KvEventBatch next;
    next.set_instance_id(50 + i);
    next.set_seq(10);
    pb::BlockStored* stored = next.add_events()->mutable_stored();
    stored->set_medium(pb::MEDIUM_DEVICE);
    for (const BlockHash& h : later[i]) stored->add_block_hashes(h.ToBytes());
    if (i == 3) {
      ASSERT_OK(SendFrames(fakes[i]->pub, {"kv", "KvSnapshot", "\xff\xff not a snapshot"}));
    } else {
      ASSERT_OK(SendMessage(fakes[i]->pub, "kv", snap));
    }
    ASSERT_OK(SendMessage(fakes[i]->pub, "kv", next));
  }
  auto done = [&] {
    for (int i = 0; i < kFakes; ++i) {
      if (pool.counters(ids[i]).event_batches == 0) return false;
    }
    return true;
  };
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // all in before the first turn
  for (int round = 0; round < 300 && !done(); ++round) pool.Poll(10);
  ASSERT_TRUE(done());
  for (int i = 0; i < kFakes; ++i) {
    const int w = ids[i];
    std::vector<BlockHash> chain = held[i];
    chain.insert(chain.end(), later[i].begin(), later[i].end());
    if (i == 3) {
      EXPECT_EQ(pool.counters(w).dropped, 1);
      EXPECT_FALSE(index.synced(w));
      EXPECT_EQ(index.LongestPrefix(w, chain).total(), 0);
      continue;
    }
    EXPECT_EQ(pool.counters(w).snapshots, 1) << i;
    EXPECT_TRUE(index.synced(w)) << i;
    EXPECT_EQ(index.last_seq(w), 10u) << i;
    EXPECT_EQ(index.LongestPrefix(w, chain).device_blocks, 40) << i;
  }
  EXPECT_EQ(pool.counters().snapshots, kFakes - 1);
}

// A ZeroMQ socket signals new messages on its descriptor once; a send on it may take that
// signal (ZMQ_FD's contract). A reply that arrived before the router's next send must still be
// received by the next Poll, not left until some later message wakes the socket: each round
// below waits in Poll for up to a minute and must come back with the reply.
TEST(WorkerPoolTest, AReplyTheRoutersOwnSendSignalledIsNotLeftUnread) {
  zmq::context_t ctx;
  zmq::socket_t pub(ctx, zmq::socket_type::pub), router(ctx, zmq::socket_type::router);
  pub.bind("tcp://127.0.0.1:*");
  router.bind("tcp://127.0.0.1:*");
  router.set(zmq::sockopt::rcvtimeo, 10000);
  auto port = [](zmq::socket_t& s) {
    const std::string e = s.get(zmq::sockopt::last_endpoint);
    return std::stoi(e.substr(e.rfind(':') + 1));
  };
  PrefixIndex index;
  WorkerPool pool(ctx, &index, absl::Seconds(60));
  const int w = pool.Add({"fake", "127.0.0.1", port(router), port(pub)});
  for (int round = 0; round < 5; ++round) {
    const std::string id = absl::StrCat("r", round);
    ASSERT_OK(pool.Send(w, kvserve::testing::MakeRequest(id, {1, 2, 3}, 1)));
    ASSERT_OK_AND_ASSIGN(std::optional<ReceivedMessage> got, ReceiveMessage(router, true));
    ASSERT_TRUE(got.has_value());
    pb::GenerateResponse reply;
    reply.set_request_id(id);
    ASSERT_OK(SendMessage(router, got->prefix, reply));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the reply is at the pool
    pb::AbortRequest other;  // this send processes the socket's pending commands
    other.set_request_id("other");
    ASSERT_OK(pool.Send(w, other));
    ASSERT_OK_AND_ASSIGN(got, ReceiveMessage(router, true));
    ASSERT_TRUE(got.has_value());
    std::vector<std::pair<int, ReceivedMessage>> replies = pool.Poll(60000);
    ASSERT_EQ(replies.size(), 1u) << "round " << round;
    pb::GenerateResponse r;
    ASSERT_OK(ParseMessage(replies[0].second, &r));
    EXPECT_EQ(r.request_id(), id);
  }
}

}  // namespace
}  // namespace kvserve::router
