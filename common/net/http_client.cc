#include "common/net/http_client.h"

#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdint>
#include <limits>
#include <regex>

#include "absl/strings/str_cat.h"
#include "boost/asio/connect.hpp"
#include "boost/asio/ip/tcp.hpp"
#include "boost/beast/core.hpp"
#include "boost/beast/http.hpp"

namespace kvserve {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

absl::StatusOr<Endpoint> ParseUrl(const std::string& url) {
  static const std::regex re(R"(^http://([^/:]+):(\d+)/?$)");
  std::smatch m;
  if (!std::regex_match(url, m, re)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--url '", url, "' is not http://HOST:PORT (no path, no TLS)"));
  }
  return Endpoint{m[1], m[2]};
}

void HttpCancel::Cancel() {
  std::lock_guard<std::mutex> lock(mu_);
  cancelled_ = true;
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

bool HttpCancel::cancelled() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cancelled_;
}

// Registers a call's socket with its HttpCancel for the scope's life.
class HttpCancelScope {
 public:
  HttpCancelScope(HttpCancel* c, int fd) : c_(c) {
    if (c_ == nullptr) return;
    std::lock_guard<std::mutex> lock(c_->mu_);
    c_->fd_ = fd;
    if (c_->cancelled_) ::shutdown(fd, SHUT_RDWR);
  }
  ~HttpCancelScope() {
    if (c_ == nullptr) return;
    std::lock_guard<std::mutex> lock(c_->mu_);
    c_->fd_ = -1;
  }
  HttpCancelScope(const HttpCancelScope&) = delete;
  HttpCancelScope& operator=(const HttpCancelScope&) = delete;

 private:
  HttpCancel* c_;
};

namespace {
void SetIoTimeout(int fd, int ms) {
  if (ms <= 0) return;
  timeval tv{ms / 1000, (ms % 1000) * 1000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}
}  // namespace

HttpConnectionPool::~HttpConnectionPool() {
  for (auto& [key, fds] : idle_) {
    for (const auto& [fd, v6] : fds) ::close(fd);
  }
}

std::pair<int, bool> HttpConnectionPool::Take(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = idle_.find(key);
  if (it == idle_.end() || it->second.empty()) return {-1, false};
  const std::pair<int, bool> c = it->second.back();
  it->second.pop_back();
  return c;
}

void HttpConnectionPool::Put(const std::string& key, int fd, bool v6) {
  std::lock_guard<std::mutex> lock(mu_);
  idle_[key].emplace_back(fd, v6);
}

namespace {

// One exchange on `stream` (connected). `answered`: set once the status line is read;
// `reusable`: the answer was read whole and the server keeps the connection.
absl::StatusOr<int> ExchangeOn(beast::tcp_stream& stream, const Endpoint& ep, http::verb verb,
                               const std::string& target, const std::string& body,
                               const std::function<void(std::string_view)>& on_body,
                               const ExchangeOptions& options, bool* answered, bool* reusable) {
  const int fd = stream.socket().native_handle();
  SetIoTimeout(fd, options.io_timeout_ms);
  HttpCancelScope scope(options.cancel, fd);
  http::request<http::string_body> req{verb, target, 11};
  req.set(http::field::host, ep.host);
  req.set(http::field::content_type, "application/json");
  req.keep_alive(options.pool != nullptr);
  req.body() = body;
  req.prepare_payload();
  http::write(stream, req);
  if (options.sent != nullptr) *options.sent = true;
  beast::flat_buffer buffer;
  http::response_parser<http::buffer_body> parser;
  parser.body_limit(options.max_body_bytes > 0 ? options.max_body_bytes
                                               : std::numeric_limits<std::uint64_t>::max());
  http::read_header(stream, buffer, parser);
  *answered = true;
  const int status = parser.get().result_int();
  if (options.on_status) options.on_status(status);
  char chunk[16384];
  while (!parser.is_done()) {
    parser.get().body().data = chunk;
    parser.get().body().size = sizeof(chunk);
    // read_some returns with what one read brought (http::read would wait for the buffer to
    // fill or the body to end, and every event would be dated at the end of the stream).
    beast::error_code ec;
    http::read_some(stream, buffer, parser, ec);
    if (ec == http::error::need_buffer) ec = {};
    if (ec && ec != http::error::end_of_stream) throw beast::system_error(ec);
    const size_t got = sizeof(chunk) - parser.get().body().size;
    if (got > 0) on_body(std::string_view(chunk, got));
    if (ec == http::error::end_of_stream) break;
  }
  *reusable = parser.is_done() && parser.keep_alive() && buffer.size() == 0;
  return status;
}

}  // namespace

absl::StatusOr<int> Exchange(const Endpoint& ep, http::verb verb, const std::string& target,
                             const std::string& body,
                             const std::function<void(std::string_view)>& on_body,
                             const ExchangeOptions& options) {
  const std::string key = absl::StrCat(ep.host, ":", ep.port);
  for (int attempt = 0;; ++attempt) {
    if (options.cancel != nullptr && options.cancel->cancelled()) {
      return absl::CancelledError(absl::StrCat(key, target, ": cancelled"));
    }
    const auto [idle, v6] = options.pool != nullptr && attempt == 0
                                ? options.pool->Take(key)
                                : std::pair<int, bool>{-1, false};
    bool answered = false, reusable = false;
    try {
      net::io_context ioc;
      beast::tcp_stream stream(ioc);
      if (idle >= 0) {
        stream.socket().assign(v6 ? tcp::v6() : tcp::v4(), idle);
      } else {
        tcp::resolver resolver(ioc);
        stream.connect(resolver.resolve(ep.host, ep.port));
        if (options.pool != nullptr) options.pool->CountOpened();
      }
      absl::StatusOr<int> status =
          ExchangeOn(stream, ep, verb, target, body, on_body, options, &answered, &reusable);
      if (options.cancel != nullptr && options.cancel->cancelled()) {
        return absl::CancelledError(absl::StrCat(key, target, ": cancelled"));
      }
      if (reusable && options.pool != nullptr) {
        const bool is_v6 = stream.socket().local_endpoint().protocol() == tcp::v6();
        options.pool->Put(key, stream.socket().release(), is_v6);
        return status;
      }
      beast::error_code ignored;
      stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
      return status;
    } catch (const std::exception& e) {
      if (const auto* s = dynamic_cast<const beast::system_error*>(&e);
          s != nullptr && s->code() == http::error::body_limit) {
        return absl::ResourceExhaustedError(
            absl::StrCat(key, target, ": the body is over ", options.max_body_bytes, " bytes"));
      }
      if (options.cancel != nullptr && options.cancel->cancelled()) {
        return absl::CancelledError(absl::StrCat(key, target, ": cancelled"));
      }
      // A kept-alive connection the server closed while it sat idle: once more, on a new one.
      if (idle >= 0 && !answered) continue;
      return absl::UnavailableError(absl::StrCat(key, target, ": ", e.what()));
    }
  }
}

absl::StatusOr<std::string> Fetch(const Endpoint& ep, http::verb verb, const std::string& target,
                                  const std::string& body, const ExchangeOptions& options) {
  std::string out;
  absl::StatusOr<int> status = Exchange(
      ep, verb, target, body, [&](std::string_view s) { out.append(s); }, options);
  if (!status.ok()) return status.status();
  if (*status != 200) {
    return absl::UnavailableError(absl::StrCat(target, " answered ", *status, ": ", out));
  }
  return out;
}

}  // namespace kvserve
