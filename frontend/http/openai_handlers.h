// The OpenAI API of the HTTP front: /v1/completions and /v1/chat/completions (whole or
// streamed as server-sent events) and /v1/models. A completion tokenizes the prompt, hands one
// job to the core (frontend/core/core.h), and turns the worker's token deltas into OpenAI
// responses: incremental detokenization, stop strings across token boundaries, n choices, logprobs,
// usage with cached tokens. A client that goes away mid-stream aborts its request on the worker.
//
// Handlers run on the front's handler threads (--api-threads, frontend/http/front_context.h),
// several at once; a completion's deltas arrive on the core thread and are posted to the
// completion's strand on the handler threads.
#ifndef KVSERVE_FRONTEND_HTTP_OPENAI_HANDLERS_H_
#define KVSERVE_FRONTEND_HTTP_OPENAI_HANDLERS_H_

#include <memory>

#include "frontend/http/front_context.h"
#include "frontend/http/http_connection.h"

namespace kvserve::frontend {

// POST /v1/completions (chat false) or /v1/chat/completions (chat true). `ctx` must outlive
// the request.
void HandleCompletion(FrontContext& ctx, const std::shared_ptr<HttpConnection>& conn,
                      const HttpRequest& request, bool chat);

// POST /v1/responses: OpenAI's Responses API (frontend/request/responses_request.h; stored
// responses: frontend/http/stored_responses.h), answered by the same completion path in the
// Responses shapes (frontend/output/responses_output.h).
void HandleResponses(FrontContext& ctx, const std::shared_ptr<HttpConnection>& conn,
                     const HttpRequest& request);

// POST /v1/messages: Anthropic's Messages API as vLLM serves it
// (frontend/request/messages_request.h), answered by the same completion path in Anthropic's shapes
// (frontend/output/messages_output.h).
void HandleMessages(FrontContext& ctx, const std::shared_ptr<HttpConnection>& conn,
                    const HttpRequest& request);

// POST /v1/messages/count_tokens: {"input_tokens": N}, the prompt's tokens as rendered.
void HandleCountTokens(const FrontContext& ctx, HttpConnection& conn, const HttpRequest& request);

// GET /v1/models: the served model.
void HandleModels(const FrontContext& ctx, HttpConnection& conn);

// GET /version: {"version": kVersion} (vLLM's route).
void HandleVersion(HttpConnection& conn);

// POST /invocations (SageMaker's route, as vLLM serves it): a body with `messages` is a chat
// completion, one with `prompt` a completion; anything else is a 400.
void HandleInvocations(FrontContext& ctx, const std::shared_ptr<HttpConnection>& conn,
                       const HttpRequest& request);

}  // namespace kvserve::frontend

#endif  // KVSERVE_FRONTEND_HTTP_OPENAI_HANDLERS_H_
