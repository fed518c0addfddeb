// kvserve-worker --openai-port: the OpenAI API served by the worker process itself (chat,
// completions, the Responses and Messages APIs, /tokenize, /v1/models, /metrics with vLLM's
// names), so that one kvserve worker is a drop-in vLLM-like pod for a gateway, an endpoint
// picker or another router.
//
// It is the front end (frontend/http/http_front.h) over a LocalCore (local_core.h): this
// process, reached over ZeroMQ on loopback (or the worker's own address), through CURVE with a
// key pair made at start when the worker has keys (the worker's ZAP handler allows that key
// beside its directory's). Tokenization is the model's own tokenizer, as in the router.
// Threads: the front's I/O and handler threads and the core's thread, none of which touches the
// engine; everything crosses the ZeroMQ link as it would from a router. Links no placement.
//
//   ASSIGN_OR_RETURN(auto front, OpenAiFront::Start(options, front_options));
//   ... server->Run(...) ...
//   front->Stop(grace);
#ifndef KVSERVE_WORKER_OPENAI_OPENAI_FRONT_H_
#define KVSERVE_WORKER_OPENAI_OPENAI_FRONT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/tokenizer/tokenizer.h"
#include "frontend/core/front_metrics.h"
#include "frontend/http/front_context.h"
#include "frontend/http/http_front.h"
#include "worker/openai/local_core.h"

namespace kvserve::worker {

struct OpenAiFrontOptions {
  std::string model_dir;  // the tokenizer's files
  // The link to this worker (its ports as this process reaches them, CURVE) and admission.
  LocalCoreOptions core;
};

class OpenAiFront {
 public:
  // Loads the tokenizer, starts the core (connecting to the worker) and binds the front at
  // front.host:front.port.
  static absl::StatusOr<std::unique_ptr<OpenAiFront>> Start(const OpenAiFrontOptions& options,
                                                            const frontend::FrontOptions& front);
  ~OpenAiFront();
  [[nodiscard]] int port() const { return front_->port(); }
  // Takes no new connection, waits up to `grace` for those open, then stops; idempotent.
  void Stop(absl::Duration grace);

 private:
  OpenAiFront() = default;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  frontend::FrontMetrics metrics_;
  std::unique_ptr<LocalCore> core_;
  std::unique_ptr<frontend::HttpFront> front_;
};

}  // namespace kvserve::worker

#endif  // KVSERVE_WORKER_OPENAI_OPENAI_FRONT_H_
