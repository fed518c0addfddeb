#include "common/net/http_server.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <list>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace kvserve {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

namespace {

// A request must arrive, and its answer leave, within this; a client that does neither is cut.
constexpr std::chrono::seconds kDeadline{5};
// Connections open at once; past it the oldest is closed to make room, so that a probe is
// always answered however many idle connections others hold open.
constexpr size_t kMaxConnections = 64;

}  // namespace

struct HttpServer::Impl {
  class Session;

  asio::io_context io;
  tcp::acceptor acceptor{io};
  Handler handler;
  std::list<std::weak_ptr<Session>> open;  // oldest first; only the io thread touches it

  void Accept();
};

// One connection: one request read and one response written, each within kDeadline, then close.
class HttpServer::Impl::Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, Impl* impl) : stream_(std::move(socket)), impl_(impl) {
    parser_.header_limit(8 * 1024);
    parser_.body_limit(4 * 1024);  // GETs; nothing here takes a body
  }

  void Start() {
    stream_.expires_after(kDeadline);
    http::async_read(
        stream_, buffer_, parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->Answer(ec); });
  }

  // Ends the connection now (room for a newer one).
  void Close() {
    beast::error_code ec;
    stream_.socket().close(ec);
  }

 private:
  void Answer(beast::error_code ec) {
    if (ec == http::error::end_of_stream || ec == beast::error::timeout ||
        ec == asio::error::operation_aborted) {
      return Close();
    }
    if (ec) {
      res_.result(http::status::bad_request);
      res_.body() = "malformed request\n";
    } else {
      const auto& req = parser_.get();
      HttpResponse r = impl_->handler(std::string(req.method_string()), std::string(req.target()));
      res_.result(static_cast<http::status>(r.status));
      res_.set(http::field::content_type, r.content_type);
      res_.body() = std::move(r.body);
    }
    res_.version(11);
    res_.keep_alive(false);
    res_.prepare_payload();
    stream_.expires_after(kDeadline);
    http::async_write(stream_, res_, [self = shared_from_this()](beast::error_code, size_t) {
      beast::error_code ignored;
      self->stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
      self->Close();
    });
  }

  beast::tcp_stream stream_;
  Impl* impl_;
  beast::flat_buffer buffer_;
  http::request_parser<http::string_body> parser_;
  http::response<http::string_body> res_;
};

void HttpServer::Impl::Accept() {
  acceptor.async_accept([this](beast::error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted) return;
    if (!ec) {
      open.remove_if([](const std::weak_ptr<Session>& s) { return s.expired(); });
      while (open.size() >= kMaxConnections) {
        if (std::shared_ptr<Session> oldest = open.front().lock()) oldest->Close();
        open.pop_front();
      }
      auto session = std::make_shared<Session>(std::move(socket), this);
      open.push_back(session);
      session->Start();
    } else {
      LOG_EVERY_T(WARNING, 10) << "metrics port: accept: " << ec.message();
    }
    Accept();
  });
}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const std::string& host, int port,
                                                              Handler handler) {
  std::unique_ptr<HttpServer> s(new HttpServer());
  s->impl_ = std::make_unique<Impl>();
  s->impl_->handler = std::move(handler);
  beast::error_code ec;
  const asio::ip::address address = asio::ip::make_address(host, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics-host '", host, "' is not a numeric IP address"));
  }
  tcp::endpoint ep(address, static_cast<unsigned short>(port));
  auto& acc = s->impl_->acceptor;
  acc.open(ep.protocol(), ec);
  if (!ec) acc.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acc.bind(ep, ec);
  if (!ec) acc.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat("--metrics-port ", port, ": ", ec.message()));
  }
  s->port_ = acc.local_endpoint().port();
  s->impl_->Accept();
  s->thread_ = std::thread([impl = s->impl_.get()] { impl->io.run(); });
  return s;
}

void HttpServer::Stop() {
  if (!thread_.joinable()) return;
  asio::post(impl_->io, [impl = impl_.get()] {
    beast::error_code ec;
    impl->acceptor.close(ec);
  });
  impl_->io.stop();
  thread_.join();
}

HttpServer::~HttpServer() { Stop(); }

}  // namespace kvserve
