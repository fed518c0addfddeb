// kvserve-router's HTTP front door (Boost.Beast, async): one I/O thread owns every socket and
// does nothing else; the handlers (parsing, tokenization, detokenization, stop strings, JSON) run
// on --api-threads threads, so one large prompt does not hold up other clients' streams (with
// --api-threads 0 generation's run on the I/O thread: fewer hand-offs, no such guarantee). Each
// request is routed by method and path to its handler: the OpenAI API
// (frontend/http/openai_handlers.h: /v1/completions, /v1/chat/completions, /v1/models), the
// operator endpoints (frontend/http/admin_handlers.h: /admin/*, /tokenize, /detokenize), and
// /health, /ready and /metrics. /v1/* needs an API key when --api-keys is set
// (frontend/http/auth.h).
//
//   ASSIGN_OR_RETURN(auto front, HttpFront::Start(options, tokenizer, &core, &metrics));
//   ... serve ...
//   front->Stop();
#ifndef KVSERVE_FRONTEND_HTTP_HTTP_FRONT_H_
#define KVSERVE_FRONTEND_HTTP_HTTP_FRONT_H_

#include <memory>
#include <thread>

#include "absl/status/statusor.h"
#include "common/tokenizer/tokenizer.h"
#include "frontend/core/core.h"
#include "frontend/core/front_metrics.h"
#include "frontend/http/front_context.h"

namespace boost::asio {
class io_context;
}  // namespace boost::asio

namespace kvserve::frontend {

class HttpFront {
 public:
  // Binds and starts serving. `tokenizer`, `core` and `metrics` must outlive the front, and
  // `core` must be destroyed before the front (its jobs hold connections). InvalidArgument for
  // a bad --host, Unavailable when the port cannot be bound.
  static absl::StatusOr<std::unique_ptr<HttpFront>> Start(const FrontOptions& options,
                                                          const tokenizer::Tokenizer* tokenizer,
                                                          Core* core, FrontMetrics* metrics);
  ~HttpFront();
  [[nodiscard]] int port() const;
  // What its one I/O thread runs: the sockets, and with --api-threads 0 the handlers too, and
  // whatever else is handed it (kvserve-router's core: RouterCore::StartOn).
  boost::asio::io_context& io();
  // Closes the listening socket: no new connection; those open go on. Any thread.
  void StopAccepting();
  // Stops serving and joins its threads; idempotent.
  void Stop();

  struct Impl;

 private:
  HttpFront() = default;
  std::unique_ptr<Impl> impl_;
  std::thread thread_;
};

}  // namespace kvserve::frontend

#endif  // KVSERVE_FRONTEND_HTTP_HTTP_FRONT_H_
