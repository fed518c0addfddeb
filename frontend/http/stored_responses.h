// The Responses API's state (OpenAI's stored responses) over the front's Responses store
// (frontend/store/response_store.h): what POST /v1/responses reads (previous_response_id) and
// writes (store), and the calls on a stored response: GET /v1/responses/{id},
// DELETE /v1/responses/{id}, GET /v1/responses/{id}/input_items, POST /v1/responses/{id}/cancel.
// Every record belongs to the tenant of the API key that made it (TenantOf); another key's
// request finds nothing (404), as a response never stored.
//
// A record is the JSON {"response": the response object as answered, "input_items": its input
// with ids, "conversation": the items a chained request continues from: the previous response's
// conversation, this input, this output}.
//
// Handler threads; the store is thread-safe. A store that cannot be reached is a 503.
#ifndef KVSERVE_FRONTEND_HTTP_STORED_RESPONSES_H_
#define KVSERVE_FRONTEND_HTTP_STORED_RESPONSES_H_

#include "frontend/http/front_context.h"
#include "frontend/http/http_connection.h"
#include "frontend/output/responses_output.h"
#include "frontend/request/responses_request.h"

namespace kvserve::frontend {

// What a translation of `request` may read: whether there is a store, and the conversation of a
// response the request's tenant stored.
ResponsesState StateFor(const FrontContext& ctx, const HttpRequest& request);

// With `r.store`, has `output` store the response it answers (completed or incomplete) under the
// request's tenant. `ctx` must outlive the output.
void StoreWhenAnswered(const FrontContext& ctx, const HttpRequest& request,
                       const ResponsesRequest& r, ResponsesOutput& output);

// /v1/responses/{id}[/input_items|/cancel].
void HandleStoredResponse(const FrontContext& ctx, HttpConnection& conn,
                          const HttpRequest& request);

}  // namespace kvserve::frontend

#endif  // KVSERVE_FRONTEND_HTTP_STORED_RESPONSES_H_
