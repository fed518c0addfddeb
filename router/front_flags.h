// The OpenAI front's flags (router/front_flags.cc), shared by kvserve-router and
// kvserve-worker --openai-port.
//
//   FrontOptions f;  RouterOptions o;
//   RETURN_IF_ERROR(FrontFromFlags(max_model_len, &f, &o));
#ifndef KVSERVE_ROUTER_FRONT_FLAGS_H_
#define KVSERVE_ROUTER_FRONT_FLAGS_H_

#include "absl/status/status.h"
#include "router/front_context.h"
#include "router/router_core.h"

namespace kvserve::router {

// Fills the front's keys, limits, connection and parser options and the core's admission
// options from the flags, for a model of `max_model_len` tokens; InvalidArgument naming the flag
// that is wrong. Raises the process's open-file limit to its hard limit (each connection is a
// descriptor). Leaves host, port, names and the workers to the caller.
absl::Status FrontFromFlags(int max_model_len, FrontOptions* f, RouterOptions* o);

}  // namespace kvserve::router

#endif  // KVSERVE_ROUTER_FRONT_FLAGS_H_
