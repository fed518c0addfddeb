// What the handlers of the router's HTTP front share: its options, the tokenizer, the core that
// places requests on workers, the metrics and the request ids. Owned by HttpFront.
//
// Handlers run on the front's I/O thread; so does every use of this context but `core`'s
// thread-safe calls.
#ifndef KVSERVE_ROUTER_FRONT_CONTEXT_H_
#define KVSERVE_ROUTER_FRONT_CONTEXT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/tokenizer/tokenizer.h"
#include "router/http_connection.h"
#include "router/openai_request.h"
#include "router/router_core.h"
#include "router/router_metrics.h"

namespace kvserve::router {

struct FrontOptions {
  std::string host = "0.0.0.0";
  int port = 8000;
  std::string served_model_name;
  int max_model_len = 4096;
  ConnectionLimits connection;  // per connection: body size, read and write deadlines
  // Connections open at once; past it a new one gets a 503 with Retry-After and is closed.
  int max_connections = 4096;
  // When set, /v1/* needs "Authorization: Bearer <key>" with one of these keys.
  std::vector<std::string> api_keys;
  // Apply Unicode NFC and trim trailing whitespace of system messages before tokenizing, so
  // near-identical prompts share prefix blocks.
  bool normalize_prompts = false;
  // The admin API (/admin/workers, drain / undrain / recycle) needs this bearer token; empty
  // turns it off.
  std::string admin_token;
  // Caps on one request's stops, messages, prompt size and logprobs (400 past them).
  RequestLimits limits;
};

struct FrontContext {
  FrontOptions options;
  const tokenizer::Tokenizer* tokenizer = nullptr;
  RouterCore* core = nullptr;
  RouterMetrics* metrics = nullptr;
  std::string id_prefix;  // random per process, so that ids differ across router replicas
  uint64_t next_id = 1;

  // "chatcmpl-PREFIX-N" or "cmpl-PREFIX-N", as OpenAI names them.
  std::string NextRequestId(bool chat) {
    return (chat ? "chatcmpl-" : "cmpl-") + id_prefix + std::to_string(next_id++);
  }
};

}  // namespace kvserve::router

#endif  // KVSERVE_ROUTER_FRONT_CONTEXT_H_
