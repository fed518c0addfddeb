// The OpenAI front's flags (frontend/http/front_flags.cc), shared by kvserve-router and
// kvserve-worker --openai-port.
//
//   FrontOptions f;  Admission a;
//   RETURN_IF_ERROR(FrontFromFlags(max_model_len, &f, &a));
#ifndef KVSERVE_FRONTEND_HTTP_FRONT_FLAGS_H_
#define KVSERVE_FRONTEND_HTTP_FRONT_FLAGS_H_

#include "absl/status/status.h"
#include "frontend/core/core.h"
#include "frontend/http/front_context.h"

namespace kvserve::frontend {

// Fills the front's keys, limits, connection and parser options and the core's admission
// options from the flags, for a model of `max_model_len` tokens; InvalidArgument naming the flag
// that is wrong. Raises the process's open-file limit to its hard limit (each connection is a
// descriptor). Leaves host, port, names and the workers to the caller.
absl::Status FrontFromFlags(int max_model_len, FrontOptions* f, Admission* a);

}  // namespace kvserve::frontend

#endif  // KVSERVE_FRONTEND_HTTP_FRONT_FLAGS_H_
