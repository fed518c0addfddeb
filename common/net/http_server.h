// A small HTTP/1.1 server (Boost.Beast) for a process's /metrics, /health and /ready
// (kvserve-worker's, kvserve-upstream's): one thread, asynchronous, one request per connection. A
// request must arrive and its answer leave within 5 s, and at most 64 connections stay open (a new
// one closes the oldest), so idle or slow clients never keep a probe from its answer. The handler
// runs on that thread and must be thread-safe with respect to the process's other threads (it reads
// atomics and the metrics registry).
//
//   ASSIGN_OR_RETURN(auto http, HttpServer::Start(0, [](const std::string& path) { ... }));
//   int port = http->port();
#ifndef KVSERVE_COMMON_NET_HTTP_SERVER_H_
#define KVSERVE_COMMON_NET_HTTP_SERVER_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace kvserve {

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

class HttpServer {
 public:
  using Handler = std::function<HttpResponse(const std::string& method, const std::string& target)>;

  // Listens on host:port, host a numeric IPv4 or IPv6 address (0.0.0.0 or :: for every
  // interface), port 0 for a free port.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const std::string& host, int port,
                                                           Handler handler);
  ~HttpServer();
  [[nodiscard]] int port() const { return port_; }
  // Idempotent; joins the server thread.
  void Stop();

 private:
  HttpServer() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace kvserve

#endif  // KVSERVE_COMMON_NET_HTTP_SERVER_H_
