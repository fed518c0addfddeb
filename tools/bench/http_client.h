// The benchmark's HTTP/1.1 client: one exchange per fresh connection, the body handed over as
// its bytes arrive (so a streamed response's events are dated when they come, not when the
// stream ends). Plain http:// only. Any thread; each call is independent.
//
//   ASSIGN_OR_RETURN(Endpoint ep, ParseUrl("http://127.0.0.1:8000"));
//   ASSIGN_OR_RETURN(int status, Exchange(ep, http::verb::post, "/v1/completions", body,
//                                         [&](std::string_view bytes) { ... }));
#ifndef KVSERVE_TOOLS_BENCH_HTTP_CLIENT_H_
#define KVSERVE_TOOLS_BENCH_HTTP_CLIENT_H_

#include <functional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "boost/beast/http/verb.hpp"

namespace kvserve::bench {

struct Endpoint {
  std::string host;
  std::string port;
};

// InvalidArgument unless `url` is http://HOST:PORT (no path, no TLS).
absl::StatusOr<Endpoint> ParseUrl(const std::string& url);

// Sends one request and returns the response's status; `on_body` is called with each piece of
// the body as soon as it is read from the socket (pieces follow the network's segments, not
// the protocol's events). Unavailable when the server cannot be reached or the stream breaks.
absl::StatusOr<int> Exchange(const Endpoint& ep, boost::beast::http::verb verb,
                             const std::string& target, const std::string& body,
                             const std::function<void(std::string_view)>& on_body);

// The whole body of a 200 answer; Unavailable naming the status and body otherwise.
absl::StatusOr<std::string> Fetch(const Endpoint& ep, boost::beast::http::verb verb,
                                  const std::string& target, const std::string& body = "");

}  // namespace kvserve::bench

#endif  // KVSERVE_TOOLS_BENCH_HTTP_CLIENT_H_
