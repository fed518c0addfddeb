#include "frontend/http/http_connection.h"

#include <algorithm>
#include <array>
#include <boost/asio.hpp>
#include <boost/beast/http.hpp>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace kvserve::frontend {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

HttpConnection::HttpConnection(tcp::socket socket, const ConnectionLimits& limits,
                               FrontMetrics* metrics)
    : socket_(std::move(socket)),
      executor_(socket_.get_executor()),
      limits_(limits),
      metrics_(metrics),
      read_timer_(executor_),
      write_timer_(executor_) {
  metrics_->AddOpenConnections(1);
  if (limits_.send_buffer_bytes > 0) {
    beast::error_code ignored;
    socket_.set_option(asio::socket_base::send_buffer_size(limits_.send_buffer_bytes), ignored);
  }
}

HttpConnection::~HttpConnection() { metrics_->AddOpenConnections(-1); }

void HttpConnection::Start(Handler handler) {
  handler_ = std::move(handler);
  ReadRequest();
}

void HttpConnection::ReadRequest() {
  answered_ = keep_alive_ = chunked_ = close_after_ = reading_ = read_timed_out_ = false;
  on_gone_ = nullptr;
  path_.clear();
  parser_.emplace();
  parser_->body_limit(limits_.max_body_bytes);
  // A client that sends its request slowly (or never) holds a connection: not past the deadline.
  // After a kept-alive response, the connection may first wait idle for the next one.
  const bool idle = requests_ > 0 && buffer_.size() == 0;
  read_timer_.expires_after(idle ? limits_.keep_alive_timeout : limits_.read_timeout);
  read_timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
    if (ec) return;  // cancelled: the request was read
    self->read_timed_out_ = true;
    beast::error_code ignored;
    self->socket_.cancel(ignored);
  });
  http::async_read_header(socket_, buffer_, *parser_,
                          [self = shared_from_this()](beast::error_code ec, size_t) {
                            if (ec) return self->OnRead(ec);
                            self->ReadBody();
                          });
}

void HttpConnection::ReadBody() {
  // Beast reads into the buffer's free room, 512 bytes at first: a 100 KB prompt of token ids
  // took 165 reads. Room for the body (up to 64 KB) takes it in a few.
  if (const auto length = parser_->content_length()) {
    buffer_.reserve(std::min<uint64_t>(*length, 64u << 10) + buffer_.size());
  }
  http::async_read(socket_, buffer_, *parser_,
                   [self = shared_from_this()](beast::error_code ec, size_t) { self->OnRead(ec); });
}

void HttpConnection::OnRead(beast::error_code ec) {
  read_timer_.cancel();
  if (ec == http::error::body_limit) {
    return RespondError(MakeOpenAiError(413, "invalid_request_error", "request body too large"));
  }
  if (ec && read_timed_out_ && requests_ > 0 && !parser_->got_some()) {
    beast::error_code ignored;  // an idle kept-alive connection: closed without a word
    socket_.close(ignored);
    return;
  }
  if (ec && read_timed_out_) {  // a read that completed as the timer fired is served
    return RespondError(
        MakeOpenAiError(408, "invalid_request_error",
                        "the request was not received within " +
                            absl::FormatDuration(absl::FromChrono(limits_.read_timeout))));
  }
  if (ec) return;
  http::request<http::string_body>& req = parser_->get();
  HttpRequest r;
  r.method = std::string(req.method_string());
  const std::string target(req.target());
  const size_t question = target.find('?');
  r.path = target.substr(0, question);
  if (question != std::string::npos) r.query = target.substr(question + 1);
  r.body = std::move(req.body());
  r.authorization = std::string(req[http::field::authorization]);
  r.api_key = std::string(req["x-api-key"]);
  r.session_id = std::string(req["x-session-id"]);
  r.received = std::chrono::steady_clock::now();
  r.timeout = std::string(req["x-request-timeout"]);
  path_ = r.path;
  ++requests_;
  keep_alive_ = limits_.keep_alive_timeout.count() > 0 && req.keep_alive() &&
                (limits_.keep_alive_max_open == 0 ||
                 metrics_->open_connections() < limits_.keep_alive_max_open);
  // From here on the only read is Drain or ReadAhead: it notices a client that closes before
  // its answer.
  reading_ = true;
  if (keep_alive_) {
    ReadAhead();
  } else {
    Drain(std::make_shared<std::array<char, 65536>>(), 0);
  }
  handler_(shared_from_this(), std::move(r));
}

void HttpConnection::SetOnClientGone(std::function<void()> on_gone) {
  asio::post(executor_, [self = shared_from_this(), on_gone = std::move(on_gone)]() mutable {
    if (self->gone_) return on_gone();
    self->on_gone_ = std::move(on_gone);
  });
}

void HttpConnection::ClientGone() {
  if (gone_) return;
  gone_ = true;  // later Writes are dropped; a write under way finishes or fails on its own
  if (on_gone_) std::exchange(on_gone_, nullptr)();
}

void HttpConnection::Respond(int status, std::string body, std::string_view content_type) {
  asio::post(executor_, [self = shared_from_this(), status, body = std::move(body),
                         type = std::string(content_type)]() mutable {
    self->DoRespond(status, std::move(body), type);
  });
}

void HttpConnection::DoRespond(int status, std::string body, const std::string& content_type) {
  metrics_->CountRequest(Endpoint(), status);
  auto res = std::make_shared<http::response<http::string_body>>();
  res->result(static_cast<http::status>(status));
  res->version(11);
  res->set(http::field::content_type, beast::string_view(content_type.data(), content_type.size()));
  if (status == 429 || status == 503) res->set(http::field::retry_after, "1");
  res->keep_alive(keep_alive_);
  res->body() = std::move(body);
  res->prepare_payload();
  ArmWriteDeadline();
  http::async_write(socket_, *res, [self = shared_from_this(), res](beast::error_code ec, size_t) {
    self->write_timer_.cancel();
    if (!ec && self->keep_alive_ && !self->gone_) return self->Answered();
    self->LingeringClose();
  });
}

void HttpConnection::Answered() {
  answered_ = true;
  if (!reading_) return ReadRequest();
  beast::error_code ignored;  // ReadAhead's read ends, and its handler reads the next request
  socket_.cancel(ignored);
}

void HttpConnection::ReadAhead() {
  if (buffer_.size() >= limits_.max_body_bytes) {  // far ahead: read on once this is answered
    reading_ = false;
    return;
  }
  reading_ = true;
  socket_.async_read_some(
      buffer_.prepare(65536), [self = shared_from_this()](beast::error_code ec, size_t n) {
        self->reading_ = false;
        self->buffer_.commit(n);
        if (self->answered_) {
          // The response went out meanwhile; a client that closed after it is done.
          if (ec && ec != asio::error::operation_aborted) return;
          return self->ReadRequest();
        }
        if (ec) return self->ClientGone();  // closed, reset or timed out before its answer
        self->ReadAhead();
      });
}

void HttpConnection::ArmWriteDeadline() {
  write_timer_.expires_after(limits_.write_timeout);
  write_timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
    if (ec) return;  // cancelled: the write finished
    self->metrics_->CountSlowClient();
    beast::error_code ignored;
    self->socket_.close(ignored);  // the write fails, which ends the connection
  });
}

void HttpConnection::LingeringClose() {
  beast::error_code ignored;
  socket_.shutdown(tcp::socket::shutdown_send, ignored);
  auto timer = std::make_shared<asio::steady_timer>(executor_, std::chrono::seconds(5));
  timer->async_wait([self = shared_from_this(), timer](beast::error_code) {
    beast::error_code ec;
    self->socket_.close(ec);  // a client that neither finishes nor closes
  });
  if (!reading_) Drain(std::make_shared<std::array<char, 65536>>(), 0);
}

void HttpConnection::Drain(std::shared_ptr<std::array<char, 65536>> buf, size_t total) {
  if (total > (64u << 20)) return;
  socket_.async_read_some(asio::buffer(*buf),
                          [self = shared_from_this(), buf, total](beast::error_code ec, size_t n) {
                            if (ec) return self->ClientGone();  // closed, reset or timed out
                            self->Drain(buf, total + n);
                          });
}

void HttpConnection::StartEventStream() {
  asio::post(executor_, [self = shared_from_this()] {
    // A kept-alive connection carries the stream chunked; otherwise the close ends it.
    self->DoWrite(absl::StrCat("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n",
                               "Cache-Control: no-cache\r\nX-Accel-Buffering: no\r\n",
                               self->keep_alive_ ? "Transfer-Encoding: chunked\r\n\r\n"
                                                 : "Connection: close\r\n\r\n"),
                  false);
    self->chunked_ = self->keep_alive_;
  });
}

void HttpConnection::Write(std::string data, bool last) {
  asio::post(executor_, [self = shared_from_this(), data = std::move(data), last]() mutable {
    self->DoWrite(std::move(data), last);
  });
}

void HttpConnection::DoWrite(std::string data, bool last) {
  if (gone_) return;
  if (chunked_) {
    std::string chunk =
        data.empty() ? "" : absl::StrCat(absl::Hex(data.size()), "\r\n", data, "\r\n");
    if (last) chunk += "0\r\n\r\n";
    data = std::move(chunk);
  }
  queued_bytes_ += data.size();
  if (queued_bytes_ > limits_.max_queued_bytes) {
    // The client reads slower than its stream is made: drop it rather than buffer without end.
    // A write under way fails on the closed socket and clears the queue.
    metrics_->CountSlowClient();
    beast::error_code ignored;
    socket_.close(ignored);
    return ClientGone();
  }
  writes_.push_back(std::move(data));
  close_after_ = close_after_ || last;
  if (writes_.size() == 1) WriteNext();
}

void HttpConnection::WriteNext() {
  ArmWriteDeadline();
  asio::async_write(socket_, asio::buffer(writes_.front()),
                    [self = shared_from_this()](beast::error_code ec, size_t) {
                      self->write_timer_.cancel();
                      if (ec) {
                        self->writes_.clear();
                        self->queued_bytes_ = 0;
                        return self->ClientGone();
                      }
                      self->queued_bytes_ -= self->writes_.front().size();
                      self->writes_.pop_front();
                      if (!self->writes_.empty()) return self->WriteNext();
                      if (!self->close_after_) return;
                      if (self->keep_alive_ && !self->gone_) return self->Answered();
                      beast::error_code ignored;
                      self->socket_.shutdown(tcp::socket::shutdown_both, ignored);
                    });
}

void HttpConnection::CountStreamed(int status) {
  asio::post(executor_, [self = shared_from_this(), status] {
    self->metrics_->CountRequest(self->Endpoint(), status);  // path_ is the I/O thread's
  });
}

std::string HttpConnection::Endpoint() const {
  for (const char* known :
       {"/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/messages",
        "/v1/messages/count_tokens", "/v1/models", "/tokenize", "/detokenize", "/health", "/ready",
        "/metrics", "/version", "/invocations"}) {
    if (path_ == known) return path_;
  }
  return "other";
}

}  // namespace kvserve::frontend
