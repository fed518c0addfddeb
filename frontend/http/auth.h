// Bearer-token checks of the HTTP front end: the API keys that /v1/* needs (--api-keys)
// and the admin token of /admin/* (--admin-token). Tokens are compared in constant time.
//
//   if (absl::Status s = CheckApiKey(keys, request.authorization); !s.ok()) reply 401;
//
// Secrets may come from files (--api-keys-file, --admin-token-file), as a mounted Kubernetes
// Secret gives them, so that they appear in no command line.
//
// Pure functions; any thread.
#ifndef KVSERVE_FRONTEND_HTTP_AUTH_H_
#define KVSERVE_FRONTEND_HTTP_AUTH_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kvserve::frontend {

// OK when `keys` is empty or `authorization` is "Bearer K" for one of them; else
// Unauthenticated.
absl::Status CheckApiKey(const std::vector<std::string>& keys, std::string_view authorization);

// OK when `authorization` is "Bearer TOKEN"; NotFound when `token` is empty (the admin API is
// off); else Unauthenticated.
absl::Status CheckAdminToken(const std::string& token, std::string_view authorization);

// The keys in a file's text: separated by commas or newlines, surrounding whitespace trimmed,
// lines starting with '#' skipped. InvalidArgument naming `source` when there is none (a file
// meant to hold keys and holding none must not open the API).
absl::StatusOr<std::vector<std::string>> ParseApiKeys(std::string_view text,
                                                      std::string_view source);

// A token file's text without surrounding whitespace (empty: the admin API stays off).
std::string ParseToken(std::string_view text);

}  // namespace kvserve::frontend

#endif  // KVSERVE_FRONTEND_HTTP_AUTH_H_
