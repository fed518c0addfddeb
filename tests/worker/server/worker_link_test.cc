// kvserve-worker's framed link (--link-port) as a process: requests over the link stream the
// same tokens as over ZeroMQ, a connection that does not greet is closed while the worker
// serves on, a link that closes has its requests aborted, and CURVE keys refuse the link.
#include <poll.h>
#include <unistd.h>

#include <filesystem>
#include <map>

#include "common/net/curve.h"
#include "common/net/frame_link.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "tests/testing/net.h"
#include "tests/testing/paths.h"
#include "tests/testing/status_matchers.h"
#include "tests/worker/server/worker_process.h"

namespace kvserve::testing {
namespace {

namespace pb = ::kvserve::v1;
using ::kvserve::testing::StatusIs;
using ::testing::HasSubstr;

std::vector<std::string> LinkWorkerArgs() {
  return {"--model",         FixtureModel("tiny-llama3"),
          "--max-model-len", "256",
          "--num-blocks",    "256",
          "--link-port",     "0"};
}

std::unique_ptr<FrameLink> Connect(int port) {
  absl::StatusOr<std::unique_ptr<FrameLink>> link = FrameLink::Connect("127.0.0.1", port, {});
  EXPECT_TRUE(link.ok()) << link.status();
  return link.ok() ? *std::move(link) : nullptr;
}

// Reads `link` until `done` says so or timeout_ms passes; the link's break, if it broke.
template <typename Done>
absl::Status ReadUntil(FrameLink& link, std::vector<ReceivedMessage>& got, Done done,
                       int timeout_ms = 20000) {
  for (int waited = 0; waited < timeout_ms && !done(); waited += 5) {
    RETURN_IF_ERROR(link.Flush());
    pollfd p{link.fd(), POLLIN, 0};
    poll(&p, 1, 5);
    RETURN_IF_ERROR(link.Read(got, 1024));
  }
  return absl::OkStatus();
}

// The tokens of each request id in `replies`, and how many requests finished.
std::pair<std::map<std::string, std::vector<int32_t>>, int> Tokens(
    const std::vector<ReceivedMessage>& replies) {
  std::map<std::string, std::vector<int32_t>> tokens;
  int finished = 0;
  for (const ReceivedMessage& m : replies) {
    pb::GenerateResponse r;
    if (!ParseMessage(m, &r).ok()) continue;
    auto& t = tokens[r.request_id()];
    t.insert(t.end(), r.token_ids().begin(), r.token_ids().end());
    if (r.finish_reason() != pb::FINISH_REASON_UNSPECIFIED) ++finished;
  }
  return {tokens, finished};
}

double Metric(int port, const std::string& series) {
  absl::StatusOr<std::pair<int, std::string>> m = HttpGet(port, "/metrics");
  if (!m.ok()) return -1;
  const size_t at = m->second.find("\n" + series);
  if (at == std::string::npos) return 0;
  const size_t sp = m->second.find(' ', at + 1 + series.size());
  return std::stod(m->second.substr(sp + 1, m->second.find('\n', sp) - sp - 1));
}

TEST(WorkerLinkTest, RequestsOverTheLinkStreamWhatZeroMqStreams) {
  ASSERT_OK_AND_ASSIGN(auto w, WorkerProcess::Start(LinkWorkerArgs()));
  ASSERT_GT(w->link_port(), 0);
  std::vector<pb::GenerateRequest> requests;
  for (int i = 0; i < 4; ++i) {
    requests.push_back(MakeRequest("r" + std::to_string(i), {1, 2, 3, 4, 5 + i, 6 * i}, 8,
                                   /*stream=*/i % 2 == 0));
  }
  std::unique_ptr<FrameLink> link = Connect(w->link_port());
  for (const auto& r : requests) ASSERT_OK(link->Queue(r));
  std::vector<ReceivedMessage> replies;
  ASSERT_OK(ReadUntil(*link, replies, [&] { return Tokens(replies).second == 4; }));
  auto [over_link, finished] = Tokens(replies);
  ASSERT_EQ(finished, 4);

  zmq::context_t ctx;
  Client zmq_client(ctx, w->port());
  std::vector<ReceivedMessage> zmq_replies;
  for (auto r : requests) {
    r.set_request_id(r.request_id() + "z");
    ASSERT_OK(zmq_client.Send(r));
  }
  while (Tokens(zmq_replies).second < 4) {
    std::optional<ReceivedMessage> m = zmq_client.Receive(20000);
    ASSERT_TRUE(m.has_value());
    zmq_replies.push_back(*m);
  }
  auto [over_zmq, zmq_finished] = Tokens(zmq_replies);
  for (const auto& r : requests) {
    EXPECT_EQ(over_link[r.request_id()].size(), 8u) << r.request_id();
    EXPECT_EQ(over_link[r.request_id()], over_zmq[r.request_id() + "z"]) << r.request_id();
  }
  EXPECT_EQ(w->Terminate(), 0);
}

TEST(WorkerLinkTest, AConnectionThatDoesNotGreetIsClosedAndTheWorkerServesOn) {
  ASSERT_OK_AND_ASSIGN(auto w, WorkerProcess::Start(LinkWorkerArgs()));
  // A link made on a raw connection sends no hello: its first message is a request.
  const int fd = ConnectLoopback(w->link_port());
  ASSERT_GE(fd, 0);
  FrameLink rude(fd, {});
  ASSERT_OK(rude.Queue(MakeRequest("rude", {1, 2, 3}, 2)));
  std::vector<ReceivedMessage> got;
  EXPECT_THAT(ReadUntil(
                  rude, got, [] { return false; }, 5000),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("closed")));
  EXPECT_TRUE(got.empty());
  // Served on: a greeting link gets its answer.
  std::unique_ptr<FrameLink> link = Connect(w->link_port());
  ASSERT_OK(link->Queue(MakeRequest("after", {1, 2, 3}, 2)));
  std::vector<ReceivedMessage> replies;
  ASSERT_OK(ReadUntil(*link, replies, [&] { return Tokens(replies).second == 1; }));
  EXPECT_EQ(Tokens(replies).first["after"].size(), 2u);
  EXPECT_EQ(w->Terminate(), 0);
}

TEST(WorkerLinkTest, ALinkThatClosesHasItsRequestsAborted) {
  ASSERT_OK_AND_ASSIGN(auto w, WorkerProcess::Start(LinkWorkerArgs()));
  std::unique_ptr<FrameLink> link = Connect(w->link_port());
  ASSERT_OK(link->Queue(MakeRequest("long", {1, 2, 3}, 200)));
  std::vector<ReceivedMessage> replies;
  ASSERT_OK(ReadUntil(*link, replies, [&] { return !Tokens(replies).first["long"].empty(); }));
  ASSERT_EQ(Tokens(replies).second, 0) << "finished before the link closed";
  link.reset();
  const std::string aborted = "kvserve_requests_finished_total{finished_reason=\"abort\"";
  double seen = 0;
  for (int waited = 0; waited < 10000 && seen < 1; waited += 20) {
    seen = Metric(w->metrics_port(), aborted);
    usleep(20000);
  }
  EXPECT_EQ(seen, 1);
  EXPECT_EQ(w->Terminate(), 0);
}

TEST(WorkerLinkTest, CurveKeysRefuseTheLinkByName) {
  const std::string keys = MakeTempDir();
  ASSERT_OK_AND_ASSIGN(CurveKeyPair worker, GenerateCurveKeyPair());
  ASSERT_OK(WriteCurveKeyFile(keys + "/worker.key", {true, worker.secret_key}, ""));
  ASSERT_OK_AND_ASSIGN(CurveKeyPair router, GenerateCurveKeyPair());
  std::filesystem::create_directories(keys + "/clients");
  ASSERT_OK(WriteCurveKeyFile(keys + "/clients/router.pub", {false, router.public_key}, ""));
  std::vector<std::string> args = LinkWorkerArgs();
  args.insert(args.end(), {"--curve-secret-key-file", keys + "/worker.key",
                           "--curve-allowed-clients-dir", keys + "/clients"});
  const auto [status, said] = RunWorkerToExit(args);
  EXPECT_NE(status, 0);
  EXPECT_THAT(said, HasSubstr("--link-port: the framed link carries no CURVE authentication"));
}

}  // namespace
}  // namespace kvserve::testing
