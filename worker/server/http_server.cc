#include "worker/server/http_server.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace kvserve::worker {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

struct HttpServer::Impl {
  asio::io_context io;
  tcp::acceptor acceptor{io};
  Handler handler;

  void Accept() {
    acceptor.async_accept([this](beast::error_code ec, tcp::socket socket) {
      if (ec) {
        if (ec != asio::error::operation_aborted) Accept();
        return;
      }
      Serve(std::move(socket));
      Accept();
    });
  }

  // One request, one response, close. Scrapes and probes are short; a slow or malformed
  // client costs at most the read timeout.
  void Serve(tcp::socket socket) {
    beast::tcp_stream stream(std::move(socket));
    stream.expires_after(std::chrono::seconds(5));
    beast::flat_buffer buffer;
    http::request<http::string_body> req;
    beast::error_code ec;
    http::read(stream, buffer, req, ec);
    http::response<http::string_body> res;
    if (ec) {
      res.result(http::status::bad_request);
      res.body() = "malformed request\n";
    } else {
      HttpResponse r = handler(std::string(req.method_string()), std::string(req.target()));
      res.result(static_cast<http::status>(r.status));
      res.set(http::field::content_type, r.content_type);
      res.body() = std::move(r.body);
    }
    res.version(11);
    res.keep_alive(false);
    res.prepare_payload();
    http::write(stream, res, ec);
    stream.socket().shutdown(tcp::socket::shutdown_both, ec);
  }
};

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

}  // namespace kvserve::worker
