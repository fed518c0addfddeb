// The router's operator endpoints: /admin/workers (a snapshot of every worker; needs the admin
// token) with POST /admin/workers/NAME/(drain|undrain|recycle), and vLLM's /tokenize and
// /detokenize.
//
// Handlers run on the front's handler threads (--api-threads, frontend/http/front_context.h),
// several at once; they hand every write to the I/O thread through the connection.
#ifndef KVSERVE_FRONTEND_HTTP_ADMIN_HANDLERS_H_
#define KVSERVE_FRONTEND_HTTP_ADMIN_HANDLERS_H_

#include "frontend/http/front_context.h"
#include "frontend/http/http_connection.h"

namespace kvserve::frontend {

// Any method under /admin/: 404 while the admin API is off, 401 without the token.
void HandleAdmin(FrontContext& ctx, HttpConnection& conn, const HttpRequest& request);

// POST /tokenize: {"prompt": TEXT [, "add_special_tokens": B]} or a chat's {"messages": ...};
// answers {"tokens", "count", "max_model_len"}.
void HandleTokenize(const FrontContext& ctx, HttpConnection& conn, const HttpRequest& request);

// POST /detokenize: {"tokens": [ids]}; answers {"prompt": TEXT}.
void HandleDetokenize(const FrontContext& ctx, HttpConnection& conn, const HttpRequest& request);

}  // namespace kvserve::frontend

#endif  // KVSERVE_FRONTEND_HTTP_ADMIN_HANDLERS_H_
