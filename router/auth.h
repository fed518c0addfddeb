// Bearer-token checks of the router's HTTP front: the API keys that /v1/* needs (--api-keys)
// and the admin token of /admin/* (--admin-token). Tokens are compared in constant time.
//
//   if (absl::Status s = CheckApiKey(keys, request.authorization); !s.ok()) reply 401;
//
// Pure functions; any thread.
#ifndef KVSERVE_ROUTER_AUTH_H_
#define KVSERVE_ROUTER_AUTH_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"

namespace kvserve::router {

// OK when `keys` is empty or `authorization` is "Bearer K" for one of them; else
// Unauthenticated.
absl::Status CheckApiKey(const std::vector<std::string>& keys, std::string_view authorization);

// OK when `authorization` is "Bearer TOKEN"; NotFound when `token` is empty (the admin API is
// off); else Unauthenticated.
absl::Status CheckAdminToken(const std::string& token, std::string_view authorization);

}  // namespace kvserve::router

#endif  // KVSERVE_ROUTER_AUTH_H_
