// A small blocking HTTP/1.1 client (Boost.Beast): one exchange per fresh connection, or per
// kept-alive one from an HttpConnectionPool; the body handed over as its bytes arrive (a
// streamed response's events are seen when they come, not when the stream ends). Plain http://
// only. Used by the serving benchmark and by the router's OpenAI-upstream bridge. Any thread;
// each call is independent; an HttpCancel lets another thread end a call in flight.
//
//   ASSIGN_OR_RETURN(Endpoint ep, ParseUrl("http://127.0.0.1:8000"));
//   ASSIGN_OR_RETURN(int status, Exchange(ep, http::verb::post, "/v1/completions", body,
//                                         [&](std::string_view bytes) { ... }));
#ifndef KVSERVE_COMMON_NET_HTTP_CLIENT_H_
#define KVSERVE_COMMON_NET_HTTP_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "boost/beast/http/verb.hpp"

namespace kvserve {

struct Endpoint {
  std::string host;
  std::string port;
};

// InvalidArgument unless `url` is http://HOST:PORT (no path, no TLS).
absl::StatusOr<Endpoint> ParseUrl(const std::string& url);

// Ends an Exchange in flight from another thread: Cancel() shuts its socket down, so its read
// returns and the call ends Cancelled (and one that has not connected yet ends as soon as it
// does). Thread-safe; one per call.
class HttpCancel {
 public:
  void Cancel();
  [[nodiscard]] bool cancelled() const;

 private:
  friend class HttpCancelScope;
  mutable std::mutex mu_;
  int fd_ = -1;  // the call's socket while it is open
  bool cancelled_ = false;
};

// Idle kept-alive connections, reused by the Exchanges that name this pool (as an SDK's or a
// load balancer's client pools them). Thread-safe.
class HttpConnectionPool {
 public:
  HttpConnectionPool() = default;
  ~HttpConnectionPool();
  HttpConnectionPool(const HttpConnectionPool&) = delete;
  HttpConnectionPool& operator=(const HttpConnectionPool&) = delete;

  // An idle connection to `key` (its descriptor and whether it is IPv6), or -1.
  std::pair<int, bool> Take(const std::string& key);
  void Put(const std::string& key, int fd, bool v6);
  // Connections opened, for the pool's users' reports.
  void CountOpened() { opened_.fetch_add(1); }
  [[nodiscard]] int64_t opened() const { return opened_.load(); }

 private:
  std::mutex mu_;
  std::map<std::string, std::vector<std::pair<int, bool>>> idle_;
  std::atomic<int64_t> opened_{0};
};

struct ExchangeOptions {
  HttpCancel* cancel = nullptr;
  // Reuse a kept-alive connection from it, and give it back once the answer is read whole
  // (a reused connection the server has closed meanwhile is replaced once, before the answer).
  HttpConnectionPool* pool = nullptr;
  // A read or write that waits this long fails the call (Unavailable); 0: no limit.
  int io_timeout_ms = 0;
  // Called with the status once the headers are read, before the body's first piece.
  std::function<void(int)> on_status;
  // Set true once the whole request is written: a call that fails with it false never
  // reached the server (refused, unreachable, reset while writing).
  bool* sent = nullptr;
  // A response body longer than this fails the call (ResourceExhausted); 0: no limit.
  uint64_t max_body_bytes = 0;
};

// Sends one request and returns the response's status; `on_body` is called with each piece of
// the body as soon as it is read from the socket (pieces follow the network's segments, not
// the protocol's events). Unavailable when the server cannot be reached or the stream breaks.
absl::StatusOr<int> Exchange(const Endpoint& ep, boost::beast::http::verb verb,
                             const std::string& target, const std::string& body,
                             const std::function<void(std::string_view)>& on_body,
                             const ExchangeOptions& options = {});

// The whole body of a 200 answer; Unavailable naming the status and body otherwise.
absl::StatusOr<std::string> Fetch(const Endpoint& ep, boost::beast::http::verb verb,
                                  const std::string& target, const std::string& body = "",
                                  const ExchangeOptions& options = {});

}  // namespace kvserve

#endif  // KVSERVE_COMMON_NET_HTTP_CLIENT_H_
