// The router's HTTP front against clients that hold on to it (issue 26): one that sends its
// request slowly or never is cut off at the read deadline with a 408; connections past
// --max-connections get a 503 with Retry-After; a streaming client that stops reading is
// dropped, and its request aborted on the worker, when its unsent stream passes the limit or a
// write makes no progress within the write deadline.
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/router/scripted_worker.h"

namespace kvserve::router {
namespace {

namespace pb = ::kvserve::v1;
using json = nlohmann::json;
using ::testing::HasSubstr;
using ::testing::StartsWith;
using FrontLimitsTest = ScriptedFrontTest;
using kvserve::testing::ConnectLoopback;

// What the server sends until it closes the connection (at most 20 s: a hang guard).
std::string ReadToEnd(int fd) {
  timeval tv{20, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) out.append(buf, n);
  return out;
}

// One token per reply, `n` of them, then the end.
std::vector<pb::GenerateResponse> Tokens(const pb::GenerateRequest& req, int n) {
  std::vector<pb::GenerateResponse> out(n + 1);
  for (int i = 0; i < n; ++i) {
    out[i].set_request_id(req.request_id());
    out[i].add_token_ids(1000 + i % 100);
  }
  out[n].set_request_id(req.request_id());
  out[n].set_finish_reason(pb::FINISH_REASON_LENGTH);
  out[n].mutable_usage()->set_prompt_tokens(req.prompt_token_ids_size());
  return out;
}

TEST_F(FrontLimitsTest, ASlowOrSilentClientIsCutOffAtTheReadDeadline) {
  FrontOptions f = TinyFront();
  f.connection.read_timeout = std::chrono::milliseconds(500);
  Start([](const pb::GenerateRequest& req) { return Tokens(req, 1); }, f);
  const int silent = ConnectLoopback(front_->port());
  const int slow = ConnectLoopback(front_->port());
  const std::string partial =
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n{\"model\"";
  ASSERT_EQ(write(slow, partial.data(), partial.size()), static_cast<ssize_t>(partial.size()));
  for (int fd : {silent, slow}) {
    EXPECT_THAT(ReadToEnd(fd), StartsWith("HTTP/1.1 408")) << "the connection was held open";
    close(fd);
  }
  // A client that sends in time is served.
  auto [status, body] = Post(front_->port(), "/v1/completions",
                             {{"model", "tiny"}, {"prompt", "hi"}, {"max_tokens", 1}});
  EXPECT_EQ(status, 200) << body.dump();
}

TEST_F(FrontLimitsTest, ConnectionsPastTheCapGetA503WithRetryAfter) {
  FrontOptions f = TinyFront();
  f.max_connections = 4;
  Start([](const pb::GenerateRequest& req) { return Tokens(req, 1); }, f);
  std::vector<int> held;
  for (int i = 0; i < 4; ++i) held.push_back(ConnectLoopback(front_->port()));
  for (int i = 0; i < 500 && metrics_.open_connections() < 4; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(metrics_.open_connections(), 4);
  const int extra = ConnectLoopback(front_->port());
  const std::string refused = ReadToEnd(extra);
  close(extra);
  EXPECT_THAT(refused, StartsWith("HTTP/1.1 503"));
  EXPECT_THAT(refused, HasSubstr("Retry-After: 1"));
  EXPECT_THAT(refused, HasSubstr("--max-connections"));
  EXPECT_THAT(metrics_.Serialize(), HasSubstr("kvserve_router_connections_refused_total 1"));
  for (int fd : held) close(fd);
  // Once they are gone, new connections are served again.
  int status = 0;
  for (int i = 0; i < 500 && status != 200; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    status = Post(front_->port(), "/v1/completions",
                  {{"model", "tiny"}, {"prompt", "hi"}, {"max_tokens", 1}})
                 .first;
  }
  EXPECT_EQ(status, 200);
}

// A client that asks for a long stream and then reads nothing: with the front's limits it must
// be dropped and its request aborted on the worker. (The front's send buffer is small, so that
// the kernel does not take the whole stream.)
void ExpectNonReaderDropped(const ScriptedWorker& worker, const HttpFront& front,
                            RouterMetrics& metrics) {
  const int client = ConnectLoopback(front.port(), /*receive_buffer=*/2048);
  const std::string body = json{
      {"model", "tiny"},
      {"prompt", "hi"},
      {"max_tokens", 3000},
      {"stream", true},
      {"logprobs", 5}}.dump();
  const std::string req =
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(body.size()) +
      "\r\n\r\n" + body;
  ASSERT_EQ(write(client, req.data(), req.size()), static_cast<ssize_t>(req.size()));
  for (int i = 0; i < 2000 && worker.aborts() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(worker.aborts(), 1) << "the request of a client that reads nothing runs on";
  EXPECT_THAT(metrics.Serialize(), HasSubstr("kvserve_router_slow_clients_total 1"));
  close(client);
}

std::vector<pb::GenerateResponse> LongStream(const pb::GenerateRequest& req) {
  std::vector<pb::GenerateResponse> out = Tokens(req, 3000);
  for (size_t i = 0; i + 1 < out.size(); ++i) {
    pb::PositionLogprobs* lp = out[i].add_logprobs();
    lp->mutable_sampled()->set_token_id(out[i].token_ids(0));
    for (int k = 0; k < 5; ++k) lp->add_top()->set_token_id(2000 + k);
  }
  return out;
}

TEST_F(FrontLimitsTest, AStreamThatPilesUpPastTheLimitIsDroppedAndAborted) {
  FrontOptions f = TinyFront();
  f.max_model_len = 4096;
  f.connection.send_buffer_bytes = 4096;
  f.connection.max_queued_bytes = 64 << 10;
  Start(LongStream, f, /*pace=*/std::chrono::milliseconds(1));
  ExpectNonReaderDropped(*worker_, *front_, metrics_);
}

TEST_F(FrontLimitsTest, AStreamWriteWithoutProgressIsDroppedAndAborted) {
  FrontOptions f = TinyFront();
  f.max_model_len = 4096;
  f.connection.send_buffer_bytes = 4096;
  f.connection.write_timeout = std::chrono::milliseconds(500);
  f.connection.max_queued_bytes = size_t{1} << 30;
  Start(LongStream, f, /*pace=*/std::chrono::milliseconds(1));
  ExpectNonReaderDropped(*worker_, *front_, metrics_);
}

}  // namespace
}  // namespace kvserve::router
