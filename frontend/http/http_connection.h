// One client connection of the HTTP front end (Boost.Beast): reads one request (bodies past
// the limit get a 413, a request not read within its deadline a 408), hands it to the front's
// handler, and sends one response, either whole (Respond) or as a stream of server-sent events
// (StartEventStream, then Write). Every response closes the connection. A client that goes away
// mid-stream, stops reading (a write makes no progress within its deadline) or lets more than
// the limit of a stream wait unsent, is reported once through SetOnClientGone and dropped.
// Request counts by endpoint and status go to the front's metrics.
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

  // Reads the request and calls `handler` with it (not for an unreadable request, which is
  // dropped, or an oversized one, which gets a 413).
  void Start(Handler handler);

  // A whole response; Retry-After: 1 on 429 and 503.
  void Respond(int status, std::string body, std::string_view content_type = "application/json");
  void RespondError(const OpenAiError& error) { Respond(error.http_status, error.json); }

  // A stream of server-sent events: the header now, then each Write in order; `last` closes the
  // connection once written. CountStreamed records the stream's status when it ends.
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
  // After the header: reads the body, with room for it reserved.
  void ReadBody();
  void OnRead(boost::beast::error_code ec);
  void WriteNext();
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
  bool reading_ = false;  // Drain is under way
  std::function<void()> on_gone_;
};

}  // namespace kvserve::frontend

#endif  // KVSERVE_FRONTEND_HTTP_HTTP_CONNECTION_H_
