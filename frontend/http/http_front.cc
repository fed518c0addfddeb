#include "frontend/http/http_front.h"

#include <algorithm>
#include <boost/asio.hpp>
#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "frontend/http/admin_handlers.h"
#include "frontend/http/auth.h"
#include "frontend/http/http_connection.h"
#include "frontend/http/openai_handlers.h"
#include "frontend/http/stored_responses.h"
#include "frontend/output/messages_output.h"
#include "glog/logging.h"

namespace kvserve::frontend {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

struct HttpFront::Impl {
  FrontContext ctx;
  std::unique_ptr<ResponseStore> responses;  // ctx.responses
  // --api-threads threads; with 0, one thread for what is not generation (generation runs on
  // the I/O thread).
  std::unique_ptr<asio::thread_pool> handlers;
  asio::io_context io{1};  // one thread runs it
  tcp::acceptor acceptor{io};
  asio::steady_timer accept_backoff{io};
  int port = 0;  // bound

  void Accept();
  void Dispatch(const std::shared_ptr<HttpConnection>& conn, const HttpRequest& r);
  void Ready(HttpConnection& conn, const HttpRequest& r);
};

namespace {

// The `name=N` value of a query string ("a=1&min_workers=2"), or `fallback`; -1 when present
// but not a non-negative integer.
int QueryInt(const std::string& query, std::string_view name, int fallback) {
  size_t start = 0;
  while (start <= query.size()) {
    size_t end = query.find('&', start);
    if (end == std::string::npos) end = query.size();
    const std::string_view pair(query.data() + start, end - start);
    if (pair.size() > name.size() && pair.substr(0, name.size()) == name &&
        pair[name.size()] == '=') {
      int value = 0;
      const std::string_view text = pair.substr(name.size() + 1);
      return absl::SimpleAtoi(absl::string_view(text.data(), text.size()), &value) && value >= 0
                 ? value
                 : -1;
    }
    start = end + 1;
  }
  return fallback;
}

// The API's generation endpoints: what --api-threads 0 runs on the I/O thread.
bool IsGeneration(const HttpRequest& r) {
  return r.method == "POST" && (r.path == "/v1/completions" || r.path == "/v1/chat/completions" ||
                                r.path == "/v1/messages" || r.path == "/v1/responses");
}

}  // namespace

void HttpFront::Impl::Accept() {
  acceptor.async_accept([this](boost::beast::error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted) return;
    if (ec) {
      // Out of file descriptors, say: try again shortly rather than at once, which would spin.
      LOG_EVERY_T(WARNING, 10) << "kvserve-router: accept: " << ec.message();
      accept_backoff.expires_after(std::chrono::milliseconds(50));
      accept_backoff.async_wait([this](boost::beast::error_code e) {
        if (!e) Accept();
      });
      return;
    }
    const bool full = ctx.metrics->open_connections() >= ctx.options.max_connections;
    auto conn =
        std::make_shared<HttpConnection>(std::move(socket), ctx.options.connection, ctx.metrics);
    if (full) {
      ctx.metrics->CountRefusedConnection();
      conn->RespondError(
          MakeOpenAiError(503, "service_unavailable",
                          absl::StrCat("the router has ", ctx.options.max_connections,
                                       " connections open (--max-connections); retry shortly")));
    } else {
      conn->Start([this](const std::shared_ptr<HttpConnection>& c, HttpRequest r) {
        if (ctx.options.api_threads == 0 && IsGeneration(r)) return Dispatch(c, r);
        // Off the socket thread; the body moves along, it is not copied.
        asio::post(*handlers, [this, c, r = std::move(r)] { Dispatch(c, r); });
      });
    }
    Accept();
  });
}

void HttpFront::Impl::Dispatch(const std::shared_ptr<HttpConnection>& conn, const HttpRequest& r) {
  const std::string& path = r.path;
  // The API and what reveals the served model's vocabulary follow the API-key policy.
  if (path.rfind("/v1/", 0) == 0 || path == "/tokenize" || path == "/detokenize" ||
      path == "/invocations") {
    // Anthropic's clients send the key as X-Api-Key.
    const std::string authorization =
        r.authorization.empty() && !r.api_key.empty() ? "Bearer " + r.api_key : r.authorization;
    if (absl::Status s = CheckApiKey(ctx.options.api_keys, authorization); !s.ok()) {
      const OpenAiError e = OpenAiErrorFromStatus(s, "invalid_api_key");
      return conn->RespondError(path.rfind("/v1/messages", 0) == 0 ? AnthropicError(e) : e);
    }
  }
  const bool get = r.method == "GET", post = r.method == "POST";
  if (get && path == "/health") return conn->Respond(200, "ok\n", "text/plain");
  if (get && path == "/ready") return Ready(*conn, r);
  if (get && path == "/metrics") {
    std::string text = ctx.metrics->Serialize();
    if (ctx.options.more_metrics) text += ctx.options.more_metrics();
    return conn->Respond(200, text, "text/plain; version=0.0.4; charset=utf-8");
  }
  if (get && path == "/v1/models") return HandleModels(ctx, *conn);
  if (get && path == "/version") return HandleVersion(*conn);
  if (post && path == "/invocations") return HandleInvocations(ctx, conn, r);
  if (post && path == "/v1/completions") return HandleCompletion(ctx, conn, r, /*chat=*/false);
  if (post && path == "/v1/chat/completions") return HandleCompletion(ctx, conn, r, true);
  if (post && path == "/v1/responses") return HandleResponses(ctx, conn, r);
  if (post && path == "/v1/messages") return HandleMessages(ctx, conn, r);
  if (post && path == "/v1/messages/count_tokens") return HandleCountTokens(ctx, *conn, r);
  if (path.rfind("/v1/responses/", 0) == 0) {  // retrieve, delete, cancel, input_items
    return HandleStoredResponse(ctx, *conn, r);
  }
  if (path.rfind("/admin/", 0) == 0) return HandleAdmin(ctx, *conn, r);
  if (post && path == "/tokenize") return HandleTokenize(ctx, *conn, r);
  if (post && path == "/detokenize") return HandleDetokenize(ctx, *conn, r);
  conn->RespondError(
      MakeOpenAiError(404, "not_found", absl::StrCat("no route for ", r.method, " ", path)));
}

// 200 while at least `min_workers` workers (the query's, default 1) take requests, else 503.
void HttpFront::Impl::Ready(HttpConnection& conn, const HttpRequest& r) {
  const int min_workers = QueryInt(r.query, "min_workers", 1);
  if (min_workers < 0) {
    return conn.Respond(400, "min_workers: must be a non-negative integer\n", "text/plain");
  }
  const int eligible = ctx.core->eligible_workers();
  const std::string counts = absl::StrCat(eligible, "/", ctx.core->known_workers(), " workers\n");
  if (eligible >= std::max(1, min_workers)) {
    return conn.Respond(200, "ready: " + counts, "text/plain");
  }
  conn.Respond(503, "not ready: " + counts, "text/plain");
}

absl::StatusOr<std::unique_ptr<HttpFront>> HttpFront::Start(const FrontOptions& options,
                                                            const tokenizer::Tokenizer* tokenizer,
                                                            Core* core, FrontMetrics* metrics) {
  std::unique_ptr<HttpFront> f(new HttpFront());
  f->impl_ = std::make_unique<Impl>();
  Impl& impl = *f->impl_;
  impl.ctx.options = options;
  // Past three quarters of --max-connections, answers close their connections.
  impl.ctx.options.connection.keep_alive_max_open = std::max(1, options.max_connections * 3 / 4);
  impl.ctx.tokenizer = tokenizer;
  impl.ctx.core = core;
  impl.ctx.metrics = metrics;
  ASSIGN_OR_RETURN(impl.responses, MakeResponseStore(options.responses_store));
  impl.ctx.responses = impl.responses.get();
  impl.handlers = std::make_unique<asio::thread_pool>(std::max(1, options.api_threads));
  if (options.api_threads == 0) {
    impl.ctx.handlers = impl.io.get_executor();
  } else {
    impl.ctx.handlers = impl.handlers->get_executor();
  }
  // 64 random bits: stored responses' ids ("resp_" and the request id) must not meet another
  // replica's in a shared store.
  std::random_device random;
  impl.ctx.id_prefix = absl::StrFormat("%08x%08x-", random(), random());
  boost::beast::error_code ec;
  tcp::endpoint ep(asio::ip::make_address(options.host, ec),
                   static_cast<unsigned short>(options.port));
  if (ec) {
    return absl::InvalidArgumentError(absl::StrCat("--host ", options.host, ": ", ec.message()));
  }
  impl.acceptor.open(ep.protocol(), ec);
  if (!ec) impl.acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) impl.acceptor.bind(ep, ec);
  if (!ec) impl.acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return absl::UnavailableError(absl::StrCat("--port ", options.port, ": ", ec.message()));
  impl.port = impl.acceptor.local_endpoint().port();
  impl.Accept();
  f->thread_ = std::thread([&impl] {
    auto guard = asio::make_work_guard(impl.io);
    impl.io.run();
  });
  return f;
}

int HttpFront::port() const { return impl_->port; }

boost::asio::io_context& HttpFront::io() { return impl_->io; }

void HttpFront::StopAccepting() {
  asio::post(impl_->io, [impl = impl_.get()] {
    boost::beast::error_code ignored;
    impl->acceptor.close(ignored);
    impl->accept_backoff.cancel();
  });
}

void HttpFront::Stop() {
  if (!thread_.joinable()) return;
  impl_->io.stop();
  thread_.join();
  impl_->handlers->stop();
  impl_->handlers->join();
}

HttpFront::~HttpFront() { Stop(); }

}  // namespace kvserve::frontend
