// What the handlers of the HTTP front end share: its options, the tokenizer, the core that
// places requests on workers, the metrics and the request ids. Owned by HttpFront.
//
// Handlers run on the front's handler threads (--api-threads), several at once: what they use of
// this context is constant after start, atomic, or thread-safe (the tokenizer, the core's calls,
// the metrics).
#ifndef KVSERVE_FRONTEND_HTTP_FRONT_CONTEXT_H_
#define KVSERVE_FRONTEND_HTTP_FRONT_CONTEXT_H_

#include <atomic>
#include <boost/asio/any_io_executor.hpp>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/tokenizer/tokenizer.h"
#include "frontend/core/core.h"
#include "frontend/core/front_metrics.h"
#include "frontend/http/http_connection.h"
#include "frontend/output/reasoning.h"
#include "frontend/output/tool_calls.h"
#include "frontend/request/parsed_request.h"
#include "frontend/store/response_store.h"

namespace kvserve::frontend {

struct FrontOptions {
  std::string host = "0.0.0.0";
  int port = 8000;
  std::string served_model_name;
  std::string model_root;  // --model as given: /v1/models' `root` (vLLM's ModelCard)
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
  // Threads that run the handlers (the sockets have a thread of their own). 0: the generation
  // endpoints' handlers run on the sockets' thread (and kvserve-router's core with them: a
  // request is read, placed and answered on one thread), the rest on one thread of their own.
  int api_threads = 2;
  // Caps on one request's stops, messages, prompt size and logprobs (400 past them).
  RequestLimits limits;
  // A generation request that has not finished this long after it arrived ends with a 504 (and
  // is aborted on its worker); a client may ask for less with the X-Request-Timeout header
  // (seconds). Zero: no deadline but the client's.
  absl::Duration request_timeout = absl::ZeroDuration();
  // --reasoning-parser: chat outputs' reasoning block goes to reasoning_content, and a
  // constraint holds after it.
  std::optional<ReasoningTags> reasoning;
  // --enable-auto-tool-choice with --tool-call-parser: how tool_choice "auto" outputs are read;
  // unset, such requests get a 400.
  std::optional<ToolOutput> tool_parser;
  // More Prometheus text for /metrics, after the front's own (kvserve-worker --openai-port
  // adds the worker's, vLLM's names among them). Called on the front's threads: thread-safe.
  std::function<std::string()> more_metrics;
  // The Responses API's store (frontend/store/response_store.h): embedded by default.
  ResponseStoreOptions responses_store;
};

struct FrontContext {
  FrontOptions options;
  const tokenizer::Tokenizer* tokenizer = nullptr;
  Core* core = nullptr;
  FrontMetrics* metrics = nullptr;
  // Stored responses (OpenAI's `store`); null: none kept. Thread-safe.
  ResponseStore* responses = nullptr;
  // Where the handlers run (the handler threads, or the sockets' thread with --api-threads 0); a
  // request's own work (a Completion) runs on a strand of it.
  boost::asio::any_io_executor handlers;
  std::string id_prefix;  // random per process, so that ids differ across router replicas
  std::atomic<uint64_t> next_id{1};

  // "chatcmpl-PREFIX-N" or "cmpl-PREFIX-N", as OpenAI names them.
  std::string NextRequestId(bool chat) {
    return (chat ? "chatcmpl-" : "cmpl-") + id_prefix + std::to_string(next_id++);
  }
};

}  // namespace kvserve::frontend

#endif  // KVSERVE_FRONTEND_HTTP_FRONT_CONTEXT_H_
