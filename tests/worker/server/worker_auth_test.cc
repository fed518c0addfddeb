// kvserve-worker with CURVE keys against the router's WorkerPool and against intruders: the
// probe of issue 25 (a DEALER that sends Control DRAIN and so took the worker out of rotation)
// gets nothing now, with or without a key of its own, and the worker stays ready; a router whose
// key is listed only later gets in without a restart of either; a worker refuses to expose
// unauthenticated sockets (its own, and vLLM's KV-event ones) beyond loopback unless told
// --insecure.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "gtest/gtest.h"
#include "router/worker_pool.h"
#include "tests/testing/paths.h"
#include "tests/testing/status_matchers.h"
#include "tests/worker/server/worker_process.h"

namespace kvserve::testing {
namespace {

namespace pb = ::kvserve::v1;
using ::testing::HasSubstr;

std::vector<std::string> ModelArgs() {
  return {"--model", FixtureModel("tiny-llama3"), "--max-model-len", "256", "--num-blocks", "64"};
}

double MetricValue(int port, const std::string& series) {
  absl::StatusOr<std::pair<int, std::string>> m = HttpGet(port, "/metrics");
  if (!m.ok()) return -1;
  const size_t at = m->second.find("\n" + series);
  if (at == std::string::npos) return -1;
  const size_t sp = m->second.find(' ', at + 1 + series.size());
  return std::stod(m->second.substr(sp + 1, m->second.find('\n', sp) - sp - 1));
}

pb::Control Drain() {
  pb::Control c;
  c.set_action(pb::CONTROL_ACTION_DRAIN);
  c.set_control_id(7);
  return c;
}

// Polls `pool` until worker `w` is eligible or timeout_ms passes.
bool BecomesEligible(router::WorkerPool& pool, int w, int timeout_ms) {
  for (int waited = 0; waited < timeout_ms; waited += 20) {
    pool.Poll(20);
    for (const router::WorkerView& v : pool.Views()) {
      if (v.id == w && v.eligible) return true;
    }
  }
  return false;
}

class WorkerAuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    keys_ = MakeTempDir();
    ASSERT_OK_AND_ASSIGN(CurveKeyPair worker, GenerateCurveKeyPair());
    ASSERT_OK_AND_ASSIGN(router_.own, GenerateCurveKeyPair());
    router_.server_key = worker.public_key;
    ASSERT_OK(WriteCurveKeyFile(keys_ + "/worker.key", {true, worker.secret_key}, ""));
    std::filesystem::create_directories(keys_ + "/clients");
    ASSERT_OK(
        WriteCurveKeyFile(keys_ + "/clients/router.pub", {false, router_.own.public_key}, ""));
    std::vector<std::string> args = ModelArgs();
    // Every interface: allowed because the sockets are authenticated.
    args.insert(args.end(), {"--host", "0.0.0.0", "--curve-secret-key-file", keys_ + "/worker.key",
                             "--curve-allowed-clients-dir", keys_ + "/clients"});
    ASSERT_OK_AND_ASSIGN(worker_, WorkerProcess::Start(args));
  }

  std::string keys_;
  CurveClientKeys router_;
  std::unique_ptr<WorkerProcess> worker_;
  zmq::context_t ctx_;
};

TEST_F(WorkerAuthTest, IntrudersGetNothingAndTheWorkerStaysInRotation) {
  // A refused handshake can close an intruder's pipe before it sends, and a blocking send then
  // waits forever (seen under load): the intruders send with a timeout, sent or not.
  Client plain(ctx_, worker_->port());
  plain.socket().set(zmq::sockopt::sndtimeo, 1000);
  plain.Send(Drain()).IgnoreError();
  ASSERT_OK_AND_ASSIGN(CurveKeyPair stranger_keys, GenerateCurveKeyPair());
  const CurveClientKeys stranger{stranger_keys, router_.server_key};
  Client keyed(ctx_, worker_->port(), &stranger);
  keyed.socket().set(zmq::sockopt::sndtimeo, 1000);
  keyed.Send(Drain()).IgnoreError();
  EXPECT_EQ(plain.Receive(1000), std::nullopt);
  EXPECT_EQ(keyed.Receive(1000), std::nullopt);
  ASSERT_OK_AND_ASSIGN(auto ready, HttpGet(worker_->metrics_port(), "/ready"));
  EXPECT_EQ(ready.first, 200) << "an unauthenticated DRAIN took effect";

  router::PrefixIndex index;
  router::WorkerPool pool(ctx_, &index, absl::Seconds(2), router_);
  const int w = pool.Add({"w0", "127.0.0.1", worker_->port(), worker_->events_port()});
  ASSERT_TRUE(BecomesEligible(pool, w, 10000)) << "the allowed router never heard a heartbeat";
  ASSERT_OK(pool.Send(w, MakeRequest("r1", {1, 2, 3, 4}, 3)));
  int tokens = 0;
  for (int i = 0; i < 500 && tokens < 3; ++i) {
    for (auto& [from, m] : pool.Poll(10)) {
      pb::GenerateResponse r;
      if (ParseMessage(m, &r).ok()) tokens += r.token_ids_size();
    }
  }
  EXPECT_EQ(tokens, 3);
  // The router's own DRAIN is honoured.
  ASSERT_OK(pool.Send(w, Drain()));
  bool replied = false;
  for (int i = 0; i < 300 && !replied; ++i) {
    for (auto& [from, m] : pool.Poll(10)) {
      pb::ControlReply r;
      replied |= ParseMessage(m, &r).ok() && r.ok() && r.control_id() == 7;
    }
  }
  EXPECT_TRUE(replied);
  ASSERT_OK_AND_ASSIGN(ready, HttpGet(worker_->metrics_port(), "/ready"));
  EXPECT_EQ(ready.first, 503);
  EXPECT_GE(
      MetricValue(worker_->metrics_port(), "kvserve_zmq_authentications_total{result=\"refused\""),
      1);
  EXPECT_GE(
      MetricValue(worker_->metrics_port(), "kvserve_zmq_authentications_total{result=\"accepted\""),
      2);  // the pool's DEALER and SUB
}

TEST_F(WorkerAuthTest, ARouterListedLaterGetsInWithoutARestart) {
  ASSERT_OK_AND_ASSIGN(CurveKeyPair late_keys, GenerateCurveKeyPair());
  router::PrefixIndex index;
  router::WorkerPool pool(ctx_, &index, absl::Seconds(1),
                          CurveClientKeys{late_keys, router_.server_key});
  const int w = pool.Add({"w0", "127.0.0.1", worker_->port(), worker_->events_port()});
  EXPECT_FALSE(BecomesEligible(pool, w, 1500));
  ASSERT_OK(
      WriteCurveKeyFile(keys_ + "/clients/late-router.pub", {false, late_keys.public_key}, ""));
  // ZeroMQ does not retry a refused handshake; the pool connects again after 5 s of silence.
  EXPECT_TRUE(BecomesEligible(pool, w, 15000));
  EXPECT_GE(pool.counters(w).reconnects, 1);
}

TEST(WorkerExposureTest, UnauthenticatedSocketsStayOnLoopbackUnlessInsecure) {
  std::vector<std::string> args = ModelArgs();
  args.insert(args.end(), {"--host", "0.0.0.0"});
  const auto [status, said] = RunWorkerToExit(args);
  EXPECT_NE(status, 0);
  EXPECT_THAT(said, HasSubstr("--host 0.0.0.0 is not loopback: give CURVE keys"));
  args.push_back("--insecure");
  ASSERT_OK_AND_ASSIGN(auto insecure, WorkerProcess::Start(args));
  EXPECT_EQ(insecure->Terminate(), 0);
}

// vLLM's event sockets speak no CURVE and carry prompt token ids: off loopback only with
// --insecure; on loopback or ipc:// they start.
TEST(WorkerExposureTest, VllmEventSocketsStayOnLoopbackUnlessInsecure) {
  std::vector<std::string> args = ModelArgs();
  args.insert(args.end(), {"--kv-events-config", R"({"enable_kv_cache_events": true,
      "publisher": "zmq", "endpoint": "tcp://*:0"})"});
  const auto [status, said] = RunWorkerToExit(args);
  EXPECT_NE(status, 0);
  EXPECT_THAT(said, HasSubstr("--kv-events-config: tcp://*:0 is off loopback"));
  std::vector<std::string> bad = ModelArgs();
  bad.insert(bad.end(), {"--kv-events-config", R"({"enable_kv_cache_events": true, "x": 1})"});
  EXPECT_THAT(RunWorkerToExit(bad).second, HasSubstr("--kv-events-config: x is not a key"));
  args.push_back("--insecure");
  ASSERT_OK_AND_ASSIGN(auto insecure, WorkerProcess::Start(args));
  EXPECT_EQ(insecure->Terminate(), 0);
}

// Whether something listens on address:port (a TCP connect succeeds).
bool Listens(const char* address, int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, address, &a.sin_addr);
  const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  close(fd);
  return ok;
}

// Issue 25: the metrics port bound every interface whenever --host was anything but the
// literal 127.0.0.1. It now listens on --metrics-host, which defaults to --host.
TEST(WorkerExposureTest, MetricsListenWhereTheOperatorSays) {
  std::vector<std::string> args = ModelArgs();
  args.insert(args.end(), {"--host", "127.0.0.2"});  // loopback, but not the literal 127.0.0.1
  ASSERT_OK_AND_ASSIGN(auto w, WorkerProcess::Start(args));
  EXPECT_TRUE(Listens("127.0.0.2", w->metrics_port()));
  EXPECT_FALSE(Listens("127.0.0.1", w->metrics_port())) << "the metrics port is on every interface";
  EXPECT_FALSE(Listens("127.0.0.1", w->port()));
  EXPECT_EQ(w->Terminate(), 0);
}

}  // namespace
}  // namespace kvserve::testing
