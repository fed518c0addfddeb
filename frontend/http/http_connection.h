// One client connection of the HTTP front end (Boost.Beast): reads a request (bodies past the
// limit get a 413, a first request not read within its deadline a 408), hands it to the front's
// handler, and sends its response, either whole (Respond) or as a stream of server-sent events
// (StartEventStream, then Write). HTTP/1.1 keep-alive: unless the client asked to close (or
// speaks HTTP/1.0), keep_alive_timeout is 0 or keep_alive_max_open connections are open, the
// connection then reads the next request, and is closed once idle that long; a stream on such a
// connection is sent chunked, else it ends with the connection. A client that goes away
// mid-request, stops reading (a write makes no progress within its deadline) or lets more than the
// limit of a stream wait unsent, is reported once through SetOnClientGone and dropped. Request
// counts by endpoint and status go to the front's metrics.
//
//   auto conn = std::make_shared<HttpConnection>(std::move(socket), limits, metrics);
//   conn->Start([](const std::shared_ptr<HttpConnection>& c, const HttpRequest& r) {
//     c->Respond(200, "ok\n", "text/plain");
//   });
//
// Its socket belongs to the front's I/O thread. The public methods may be called from any
// thread: each hands its work to the I/O thread, in the order of the calls.
#ifndef KVSERVE_FRONTEND_HTTP_HTTP_CONNECTION_H_
#define KVSERVE_FRONTEND_HTTP_HTTP_CONNECTION_H_

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "frontend/core/front_metrics.h"
#include "frontend/output/openai_error.h"

namespace kvserve::frontend {

// What one connection may take of the server.
struct ConnectionLimits {
  size_t max_body_bytes = 8u << 20;
  std::chrono::milliseconds read_timeout{30000};   // the whole request, from the connection
  std::chrono::milliseconds write_timeout{30000};  // each write (a stream's chunk, a response)
  size_t max_queued_bytes = 4u << 20;              // a stream's bytes not yet sent
  // The socket's SO_SNDBUF (0: the kernel's autotuning, up to megabytes a connection): what a
  // client that stops reading can hold in the kernel before the limits above see it.
  int send_buffer_bytes = 0;
  // How long a connection may wait idle for its next request (0: every response closes it).
  // Longer than a load balancer's pooled connections idle (nginx 60 s, AWS ALB 60 s), so that
  // it is the balancer that closes them, never a request racing the close.
  std::chrono::milliseconds keep_alive_timeout{75000};
  // While this many connections or more are open, answers close their connections rather than
  // keep them idle (0: no bound): idle clients do not hold the front's last connections.
  int keep_alive_max_open = 0;
};

struct HttpRequest {
  std::string method;
  std::string path;   // the target without its query
  std::string query;  // after '?', or empty
  std::string body;
  std::string authorization;                       // the Authorization header
  std::string api_key;                             // the X-Api-Key header (Anthropic's)
  std::string session_id;                          // the X-Session-Id header
  std::string timeout;                             // the X-Request-Timeout header (seconds)
  std::chrono::steady_clock::time_point received;  // when its last byte was read
};

class HttpConnection : public std::enable_shared_from_this<HttpConnection> {
 public:
  using Handler = std::function<void(const std::shared_ptr<HttpConnection>&, HttpRequest)>;

  // `metrics` must outlive the connection.
  HttpConnection(boost::asio::ip::tcp::socket socket, const ConnectionLimits& limits,
                 FrontMetrics* metrics);
  ~HttpConnection();

  // Reads requests and calls `handler` with each (not for an unreadable request, which is
  // dropped, or an oversized one, which gets a 413), the next once the last one's response is
  // written.
  void Start(Handler handler);

  // A whole response; Retry-After: 1 on 429 and 503.
  void Respond(int status, std::string body, std::string_view content_type = "application/json");
  void RespondError(const OpenAiError& error) { Respond(error.http_status, error.json); }

  // A stream of server-sent events: the header now, then each Write in order; `last` ends the
  // response once written. CountStreamed records the stream's status when it ends.
  void StartEventStream();
  void Write(std::string data, bool last);
  void CountStreamed(int status);
  // Called once when the client goes away (it closes or resets the connection, or a write
  // fails), streaming or not, before any further Write is dropped; at once if it has already
  // gone. As with vLLM, a client that shuts down its sending side after the request counts as
  // gone. Runs on the I/O thread.
  void SetOnClientGone(std::function<void()> on_gone);

 private:
  // The I/O thread's side of Respond and Write.
  void DoRespond(int status, std::string body, const std::string& content_type);
  void DoWrite(std::string data, bool last);
  // Reads the next request's header (the first, or one after a kept-alive response).
  void ReadRequest();
  // After the header: reads the body, with room for it reserved.
  void ReadBody();
  void OnRead(boost::beast::error_code ec);
  void WriteNext();
  // The response is written: the next request, or the close.
  void Answered();
  // While a kept-alive request runs: reads what the client sends next into the request buffer
  // (its next request; at most a body's limit ahead), so that its going away is seen.
  void ReadAhead();
  // Closes the connection if the write under way makes no progress within the write timeout.
  void ArmWriteDeadline();
  // Lingering close: stop sending, then read and drop what the client still sends (an
  // oversized body, say) so that it sees the response instead of a connection reset.
  void LingeringClose();
  // Reads and drops what the client sends after its request (up to 64 MiB); its end is
  // ClientGone.
  void Drain(std::shared_ptr<std::array<char, 65536>> buf, size_t total);
  void ClientGone();
  // The metric label: a known path, or "other" (labels must not grow with what clients send).
  [[nodiscard]] std::string Endpoint() const;

  boost::asio::ip::tcp::socket socket_;
  boost::asio::any_io_executor executor_;
  ConnectionLimits limits_;
  FrontMetrics* metrics_;
  boost::asio::steady_timer read_timer_, write_timer_;
  bool read_timed_out_ = false;
  size_t queued_bytes_ = 0;  // in writes_
  Handler handler_;
  boost::beast::flat_buffer buffer_;
  std::optional<boost::beast::http::request_parser<boost::beast::http::string_body>> parser_;
  std::string path_;
  std::deque<std::string> writes_;
  bool close_after_ = false;
  bool gone_ = false;
  bool reading_ = false;     // Drain or ReadAhead is under way
  bool keep_alive_ = false;  // the current request's connection outlives its response
  bool chunked_ = false;     // its stream is sent chunked
  bool answered_ = false;    // its response is written; the next request is due
  int requests_ = 0;         // read on this connection
  std::function<void()> on_gone_;
};

}  // namespace kvserve::frontend

#endif  // KVSERVE_FRONTEND_HTTP_HTTP_CONNECTION_H_
