// The HTTP client (common/net/http_client.h) hands a streamed body over as it arrives: a server
// that sends each event only once the client has seen the previous one must be answered event by
// event (the old reader waited for 16 KB or the end of the stream, and dated every event at the
// end).
#include "common/net/http_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "boost/beast/http/verb.hpp"
#include "gtest/gtest.h"

namespace kvserve {
namespace {

using Clock = std::chrono::steady_clock;

// A listening socket on a free loopback port (its port in *port).
int ListenOnLoopback(int* port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  listen(fd, 1);
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  *port = ntohs(addr.sin_port);
  return fd;
}

// A one-connection HTTP server on a loopback port that streams `events` as chunked SSE, each
// after the test says the client saw the one before (or after a 10 s wait, so that a client
// that holds events back fails the test rather than hang it).
class SseServer {
 public:
  explicit SseServer(std::vector<std::string> events) : events_(std::move(events)) {
    fd_ = ListenOnLoopback(&port_);
    thread_ = std::thread([this] { Serve(); });
  }
  ~SseServer() {
    thread_.join();
    close(fd_);
  }
  [[nodiscard]] int port() const { return port_; }
  // The client saw events up to `n` (1-based count).
  void Saw(int n) {
    std::lock_guard<std::mutex> lock(mu_);
    seen_ = n;
    cv_.notify_all();
  }
  // When event i was written to the socket.
  [[nodiscard]] Clock::time_point sent(size_t i) {
    std::lock_guard<std::mutex> lock(mu_);
    return sent_[i];
  }

 private:
  void Serve() {
    const int conn = accept(fd_, nullptr, nullptr);
    std::string request;
    char buf[4096];
    while (request.find("\r\n\r\n") == std::string::npos) {
      const ssize_t n = read(conn, buf, sizeof(buf));
      if (n <= 0) break;
      request.append(buf, n);
    }
    Write(
        conn,
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n");
    for (size_t i = 0; i < events_.size(); ++i) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait_for(lock, std::chrono::seconds(10), [&] { return seen_ >= static_cast<int>(i); });
        sent_.push_back(Clock::now());
      }
      const std::string event = absl::StrCat("data: ", events_[i], "\n\n");
      Write(conn, absl::StrCat(absl::Hex(event.size()), "\r\n", event, "\r\n"));
    }
    Write(conn, "0\r\n\r\n");
    close(conn);
  }
  static void Write(int conn, const std::string& s) {
    ASSERT_EQ(write(conn, s.data(), s.size()), static_cast<ssize_t>(s.size()));
  }

  std::vector<std::string> events_;
  int fd_ = -1, port_ = 0;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  int seen_ = 0;
  std::vector<Clock::time_point> sent_;
};

TEST(HttpClientTest, StreamedEventsArriveOneByOneAndAreDatedBeforeTheNextIsSent) {
  const std::vector<std::string> events = {"one", "two", "three", "[DONE]"};
  SseServer server(events);
  std::string pending;
  std::vector<Clock::time_point> seen_at;
  absl::StatusOr<int> status =
      Exchange({"127.0.0.1", std::to_string(server.port())}, boost::beast::http::verb::post,
               "/v1/completions", "{}", [&](std::string_view bytes) {
                 pending.append(bytes);
                 size_t end;
                 while ((end = pending.find("\n\n")) != std::string::npos) {
                   pending.erase(0, end + 2);
                   seen_at.push_back(Clock::now());
                   server.Saw(static_cast<int>(seen_at.size()));
                 }
               });
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(*status, 200);
  ASSERT_EQ(seen_at.size(), events.size());
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    EXPECT_LT(seen_at[i], server.sent(i + 1)) << "event " << i << " was held back";
  }
}

// A peer that sends more than max_body_bytes ends the call (a hostile /metrics cannot make the
// router hold it); within the limit, the same body is read whole.
TEST(HttpClientTest, ABodyOverTheLimitIsRefused) {
  const std::vector<std::string> events(8, std::string(1000, 'x'));
  for (const uint64_t limit : {uint64_t{4000}, uint64_t{100000}}) {
    SseServer server(events);
    server.Saw(static_cast<int>(events.size()));  // the server need not wait for the client
    absl::StatusOr<std::string> body =
        Fetch({"127.0.0.1", std::to_string(server.port())}, boost::beast::http::verb::get,
              "/metrics", "", {.max_body_bytes = limit});
    if (limit < 8000) {
      ASSERT_FALSE(body.ok());
      EXPECT_EQ(body.status().code(), absl::StatusCode::kResourceExhausted) << body.status();
      EXPECT_NE(body.status().message().find("over 4000 bytes"), std::string::npos);
    } else {
      ASSERT_TRUE(body.ok()) << body.status();
      EXPECT_EQ(body->size(), 8 * (1000 + 8));  // "data: " and "\n\n" around each
    }
  }
}

TEST(HttpClientTest, AnUnreachableServerIsUnavailableNamingIt) {
  // A port taken and closed at once: nothing listens there.
  int free_port = 0;
  close(ListenOnLoopback(&free_port));
  const std::string port = std::to_string(free_port);
  absl::StatusOr<int> status = Exchange({"127.0.0.1", port}, boost::beast::http::verb::get, "/x",
                                        "", [](std::string_view) {});
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(status.status().message().find("127.0.0.1:" + port), std::string::npos);
}

// Another thread's HttpCancel ends a stream that the server keeps open: the call returns
// Cancelled, and a cancelled HttpCancel stops the next call before it connects.
TEST(HttpClientTest, CancelEndsAStreamInFlightFromAnotherThread) {
  int listen_port = 0;
  const int fd = ListenOnLoopback(&listen_port);
  std::thread server([fd] {
    const int conn = accept(fd, nullptr, nullptr);
    char buf[4096];
    (void)!read(conn, buf, sizeof(buf));
    const std::string head =
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n9\r\ndata: x\n\n\r\n";
    (void)!write(conn, head.data(), head.size());
    while (read(conn, buf, sizeof(buf)) > 0) {
    }
    close(conn);
  });
  HttpCancel cancel;
  std::mutex mu;
  std::condition_variable cv;
  bool first = false;
  std::thread canceller([&] {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return first; });
    cancel.Cancel();
  });
  const std::string port = std::to_string(listen_port);
  absl::StatusOr<int> status =
      Exchange({"127.0.0.1", port}, boost::beast::http::verb::post, "/v1/completions", "{}",
               [&](std::string_view) {
                 std::lock_guard<std::mutex> lock(mu);
                 first = true;
                 cv.notify_all();
               },
               {.cancel = &cancel});
  canceller.join();
  server.join();
  close(fd);
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(Exchange({"127.0.0.1", port}, boost::beast::http::verb::get, "/", "",
                     [](std::string_view) {}, {.cancel = &cancel})
                .status()
                .code(),
            absl::StatusCode::kCancelled);
}

TEST(HttpClientTest, ParseUrlRefusesAPathOrTls) {
  EXPECT_TRUE(ParseUrl("http://localhost:8000").ok());
  EXPECT_FALSE(ParseUrl("https://localhost:8000").ok());
  EXPECT_FALSE(ParseUrl("http://localhost:8000/v1").ok());
}

}  // namespace
}  // namespace kvserve
