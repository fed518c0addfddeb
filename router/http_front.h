// kvserve-router's HTTP front door (Boost.Beast, async, one I/O thread): the OpenAI API
// (/v1/completions, /v1/chat/completions with SSE streaming, /v1/models), /tokenize,
// /detokenize, /health, /ready and /metrics. It tokenizes (chat templates included), hands
// generation to the RouterCore, and turns worker deltas into OpenAI responses: incremental
// detokenization, stop strings across token boundaries, n choices, usage with cached tokens.
#ifndef KVSERVE_ROUTER_HTTP_FRONT_H_
#define KVSERVE_ROUTER_HTTP_FRONT_H_

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tokenizer/tokenizer.h"
#include "router/router_core.h"
#include "router/router_metrics.h"

namespace kvserve::router {

struct FrontOptions {
  std::string host = "0.0.0.0";
  int port = 8000;
  std::string served_model_name;
  int max_model_len = 4096;
  size_t max_body_bytes = 8u << 20;
  // When set, /v1/* needs "Authorization: Bearer <key>" with one of these keys.
  std::vector<std::string> api_keys;
  // Apply Unicode NFC and trim trailing whitespace of system messages before tokenizing, so
  // near-identical prompts share prefix blocks.
  bool normalize_prompts = false;
  // The admin API (/admin/workers, drain / undrain / recycle) needs this bearer token; empty
  // turns it off.
  std::string admin_token;
};

class HttpFront {
 public:
  // `tokenizer` and `core` must outlive the front.
  static absl::StatusOr<std::unique_ptr<HttpFront>> Start(const FrontOptions& options,
                                                          const tokenizer::Tokenizer* tokenizer,
                                                          RouterCore* core, RouterMetrics* metrics);
  ~HttpFront();
  [[nodiscard]] int port() const;
  void Stop();

  struct Impl;

 private:
  HttpFront() = default;
  std::unique_ptr<Impl> impl_;
  std::thread thread_;
};

}  // namespace kvserve::router

#endif  // KVSERVE_ROUTER_HTTP_FRONT_H_
