// kvserve-worker --openai-port: the OpenAI API served by the worker process itself (chat,
// completions, the Responses and Messages APIs, /tokenize, /v1/models, /metrics with vLLM's
// names), so that one kvserve worker is a drop-in vLLM-like pod for a gateway, an endpoint
// picker or another router.
//
// It is kvserve-router's front and core (frontend/http/http_front.h, router/router_core.h) with one
// worker: this process, reached over ZeroMQ on loopback (or the worker's own address), through
// CURVE with a key pair made at start when the worker has keys (the worker's ZAP handler allows
// that key beside its directory's). Tokenization is the model's own tokenizer, as in the
// router. Threads: the front's I/O and handler threads and the core's thread, none of which
// touches the engine; everything crosses the ZeroMQ link as it would from a router.
//
//   ASSIGN_OR_RETURN(auto front, OpenAiFront::Start(options, front_options, core_options));
//   ... server->Run(...) ...
//   front->Stop();
#ifndef KVSERVE_WORKER_OPENAI_FRONT_H_
#define KVSERVE_WORKER_OPENAI_FRONT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/tokenizer/tokenizer.h"
#include "frontend/http/front_context.h"
#include "frontend/http/http_front.h"
#include "router/router_core.h"
#include "router/router_metrics.h"

namespace kvserve::worker {

struct OpenAiFrontOptions {
  std::string model_dir;  // the tokenizer's files
  // This worker's ZeroMQ ports as this process reaches them.
  router::WorkerEndpoint worker;
};

class OpenAiFront {
 public:
  // Loads the tokenizer, starts the core (connecting to `options.worker`) and binds the front
  // at front.host:front.port. `core` carries the admission and CURVE options; its worker list is
  // replaced by `options.worker`.
  static absl::StatusOr<std::unique_ptr<OpenAiFront>> Start(const OpenAiFrontOptions& options,
                                                            const frontend::FrontOptions& front,
                                                            router::RouterOptions core);
  ~OpenAiFront();
  [[nodiscard]] int port() const { return front_->port(); }
  // Takes no new connection, waits up to `grace` for those open, then stops; idempotent.
  void Stop(absl::Duration grace);

 private:
  OpenAiFront() = default;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  router::RouterMetrics metrics_;
  std::unique_ptr<router::RouterCore> core_;
  std::unique_ptr<frontend::HttpFront> front_;
};

}  // namespace kvserve::worker

#endif  // KVSERVE_WORKER_OPENAI_FRONT_H_
