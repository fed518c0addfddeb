// HTTP/1.1 keep-alive on the router's front: one connection carries requests in turn (a whole
// answer, then a stream sent chunked, then pipelined requests answered in order); a client that
// asks to close, or speaks HTTP/1.0, or a front with keep-alive off, gets its connection closed
// after the answer, as are answers past three quarters of --max-connections; an idle kept-alive
// connection is closed without a word at its timeout; and the client's pool reuses its
// connections, replacing one the server closed while it sat idle.
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/net/http_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/router/scripted_worker.h"

namespace kvserve::router {
namespace {

namespace pb = ::kvserve::v1;
using json = nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;
using KeepAliveTest = ScriptedFrontTest;
using kvserve::testing::ConnectLoopback;

// max_tokens tokens, one a reply, then the end.
std::vector<pb::GenerateResponse> Tokens(const pb::GenerateRequest& req) {
  const int n = req.max_tokens();
  std::vector<pb::GenerateResponse> out(n + 1);
  for (int i = 0; i <= n; ++i) out[i].set_request_id(req.request_id());
  for (int i = 0; i < n; ++i) out[i].add_token_ids(1000 + i);
  out[n].set_finish_reason(pb::FINISH_REASON_LENGTH);
  out[n].mutable_usage()->set_prompt_tokens(req.prompt_token_ids_size());
  return out;
}

std::string Request(const json& body, const std::string& headers = "",
                    const std::string& version = "HTTP/1.1") {
  const std::string text = body.dump();
  return absl::StrCat("POST /v1/completions ", version, "\r\nHost: x\r\n", headers,
                      "Content-Type: application/json\r\nContent-Length: ", text.size(), "\r\n\r\n",
                      text);
}

json Completion(bool stream) {
  return {{"model", "tiny"}, {"prompt", "hi"}, {"max_tokens", 2}, {"stream", stream}};
}

// Reads from `fd` into `carry` until it holds one whole response (by Content-Length, or chunked
// up to its last chunk, or to the close) and returns it; what follows stays in `carry`. Empty
// when the connection closed first.
std::string ReadResponse(int fd, std::string& carry) {
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  const auto more = [&] {
    char buf[4096];
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n > 0) carry.append(buf, n);
    return n > 0;
  };
  size_t head_end;
  while ((head_end = carry.find("\r\n\r\n")) == std::string::npos) {
    if (!more()) return "";
  }
  const std::string head = carry.substr(0, head_end + 4);
  size_t end = std::string::npos;
  for (;;) {
    if (const size_t at = head.find("Content-Length: "); at != std::string::npos) {
      size_t length = 0;
      (void)absl::SimpleAtoi(head.substr(at + 16, head.find("\r\n", at) - at - 16), &length);
      if (carry.size() >= head.size() + length) end = head.size() + length;
    } else if (head.find("Transfer-Encoding: chunked") != std::string::npos) {
      if (const size_t last = carry.find("\r\n0\r\n\r\n", head.size()); last != std::string::npos)
        end = last + 7;
    }
    if (end != std::string::npos || !more()) break;
  }
  if (end == std::string::npos) end = carry.size();  // closed: the rest is the answer
  std::string response = carry.substr(0, end);
  carry.erase(0, end);
  return response;
}

bool ClosedByServer(int fd) {
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  char c;
  return read(fd, &c, 1) == 0;
}

void Send(int fd, const std::string& bytes) {
  ASSERT_EQ(write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
}

// One connection: a whole answer, a stream sent chunked, two pipelined requests answered in
// order, a stream asked to close.
void CarriesRequestsInTurn(int port, const RouterMetrics& metrics) {
  const int fd = ConnectLoopback(port);
  std::string carry;
  Send(fd, Request(Completion(false)));
  const std::string whole = ReadResponse(fd, carry);
  EXPECT_THAT(whole, StartsWith("HTTP/1.1 200"));
  EXPECT_THAT(whole, Not(HasSubstr("Connection: close")));
  EXPECT_THAT(whole, HasSubstr("\"completion_tokens\":2"));

  Send(fd, Request(Completion(true)));
  const std::string stream = ReadResponse(fd, carry);
  EXPECT_THAT(stream, StartsWith("HTTP/1.1 200"));
  EXPECT_THAT(stream, HasSubstr("Transfer-Encoding: chunked"));
  EXPECT_THAT(stream, HasSubstr("data: [DONE]\n\n\r\n0\r\n\r\n"));

  // Two requests in one write: two answers, in order.
  json first = Completion(false), second = Completion(false);
  first["max_tokens"] = 1;
  Send(fd, Request(first) + Request(second));
  const std::string a = ReadResponse(fd, carry), b = ReadResponse(fd, carry);
  EXPECT_THAT(a, HasSubstr("\"completion_tokens\":1"));
  EXPECT_THAT(b, HasSubstr("\"completion_tokens\":2"));

  // Asked to close: the answer, then the close.
  Send(fd, Request(Completion(true), "Connection: close\r\n"));
  const std::string closing = ReadResponse(fd, carry);
  EXPECT_THAT(closing, HasSubstr("Connection: close"));
  EXPECT_THAT(closing, HasSubstr("data: [DONE]\n\n"));
  EXPECT_THAT(closing, Not(HasSubstr("\r\n0\r\n\r\n")));  // a stream the close ends
  EXPECT_TRUE(carry.empty());
  EXPECT_TRUE(ClosedByServer(fd));
  close(fd);
  EXPECT_THAT(metrics.Serialize(),
              HasSubstr("kvserve_router_requests_total{endpoint=\"/v1/completions\","
                        "status=\"200\"} 5"));
}

TEST_F(KeepAliveTest, OneConnectionCarriesRequestsInTurnStreamsChunkedAndPipelined) {
  Start(Tokens);
  CarriesRequestsInTurn(front_->port(), metrics_);
}

// --api-threads 0: the I/O thread runs the generation handlers and the core; the other
// endpoints (here /metrics) run on a thread of their own.
TEST_F(KeepAliveTest, OneThreadForSocketsHandlersAndCoreServesTheSame) {
  FrontOptions f = TinyFront();
  f.api_threads = 0;
  Start(Tokens, f);
  CarriesRequestsInTurn(front_->port(), metrics_);
  const int fd = ConnectLoopback(front_->port());
  std::string carry;
  Send(fd, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_THAT(ReadResponse(fd, carry), HasSubstr("kvserve_router_requests_total"));
  close(fd);
}

TEST_F(KeepAliveTest, Http10AndKeepAliveOffCloseAfterTheAnswer) {
  FrontOptions f = TinyFront();
  Start(Tokens, f);
  int fd = ConnectLoopback(front_->port());
  std::string carry;
  Send(fd, Request(Completion(false), "", "HTTP/1.0"));
  EXPECT_THAT(ReadResponse(fd, carry), HasSubstr("\"completion_tokens\":2"));
  EXPECT_TRUE(ClosedByServer(fd));
  close(fd);
  TearDown();

  f.connection.keep_alive_timeout = std::chrono::milliseconds(0);
  Start(Tokens, f);
  fd = ConnectLoopback(front_->port());
  carry.clear();
  Send(fd, Request(Completion(true)));
  const std::string stream = ReadResponse(fd, carry);
  EXPECT_THAT(stream, HasSubstr("Connection: close"));
  EXPECT_THAT(stream, HasSubstr("data: [DONE]\n\n"));
  EXPECT_TRUE(ClosedByServer(fd));
  close(fd);
}

// Past three quarters of --max-connections (3 of 4 here), answers close their connections.
TEST_F(KeepAliveTest, NearTheConnectionCapAnswersCloseTheirConnections) {
  FrontOptions f = TinyFront();
  f.max_connections = 4;
  Start(Tokens, f);
  const std::vector<int> held = {ConnectLoopback(front_->port()), ConnectLoopback(front_->port())};
  int fd = ConnectLoopback(front_->port());
  for (int i = 0; i < 500 && metrics_.open_connections() < 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(metrics_.open_connections(), 3);
  std::string carry;
  Send(fd, Request(Completion(false)));
  EXPECT_THAT(ReadResponse(fd, carry), HasSubstr("Connection: close"));
  EXPECT_TRUE(ClosedByServer(fd));
  close(fd);
  for (int h : held) close(h);  // (the closed one lingers its 5 s: below the bound)
  for (int i = 0; i < 500 && metrics_.open_connections() > 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  fd = ConnectLoopback(front_->port());
  carry.clear();
  Send(fd, Request(Completion(false)));
  EXPECT_THAT(ReadResponse(fd, carry), Not(HasSubstr("Connection: close")));
  close(fd);
}

TEST_F(KeepAliveTest, AnIdleConnectionIsClosedWithoutAWordAtItsTimeout) {
  FrontOptions f = TinyFront();
  f.connection.keep_alive_timeout = std::chrono::milliseconds(300);
  Start(Tokens, f);
  const int fd = ConnectLoopback(front_->port());
  std::string carry;
  Send(fd, Request(Completion(false)));
  EXPECT_THAT(ReadResponse(fd, carry), StartsWith("HTTP/1.1 200"));
  EXPECT_TRUE(ClosedByServer(fd)) << "no 408 on a connection that sent nothing more";
  close(fd);
}

TEST_F(KeepAliveTest, TheClientsPoolReusesConnectionsAndReplacesOneClosedWhileIdle) {
  FrontOptions f = TinyFront();
  f.connection.keep_alive_timeout = std::chrono::milliseconds(300);
  Start(Tokens, f);
  const Endpoint ep{"127.0.0.1", std::to_string(front_->port())};
  HttpConnectionPool pool;
  const auto ask = [&](bool stream) {
    std::string body;
    absl::StatusOr<int> status =
        Exchange(ep, boost::beast::http::verb::post, "/v1/completions", Completion(stream).dump(),
                 [&](std::string_view s) { body.append(s); }, {.pool = &pool});
    EXPECT_TRUE(status.ok()) << status.status();
    EXPECT_EQ(status.value_or(0), 200) << body;
    return body;
  };
  for (int i = 0; i < 4; ++i) {
    EXPECT_THAT(ask(i % 2 == 1), HasSubstr(i % 2 == 1 ? "data: [DONE]" : "completion_tokens"));
  }
  EXPECT_EQ(pool.opened(), 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(800));  // the server closes it
  EXPECT_THAT(ask(false), HasSubstr("completion_tokens"));
  EXPECT_EQ(pool.opened(), 2);
}

}  // namespace
}  // namespace kvserve::router
