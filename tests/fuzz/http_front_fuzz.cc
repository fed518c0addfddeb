// The router's HTTP front end with raw bytes in: each input is written to a real connection to
// a running HttpFront (Beast's parser, our routing, auth, the OpenAI and admin handlers, the
// tokenizer), the write side closed, and the answer read until the router closes (or 2 s).
// The router's one worker never answers, so generation requests end in an error.
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>

#include "frontend/http/http_front.h"
#include "router/router_core.h"
#include "router/router_metrics.h"
#include "tests/fuzz/fuzz_env.h"

namespace kr = kvserve::router;

namespace {
// The router, for the whole run.
kvserve::router::RouterMetrics* metrics = nullptr;
kvserve::router::RouterCore* core = nullptr;
std::unique_ptr<kvserve::tokenizer::Tokenizer> tokenizer;
std::unique_ptr<kvserve::frontend::HttpFront> front;
int port = 0;
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  auto tok = kvserve::tokenizer::Tokenizer::FromDirectory(
      kvserve::fuzz::DirFromEnv("KVSERVE_FUZZ_TOKENIZER"));
  if (!tok.ok()) abort();
  tokenizer = std::move(*tok);
  metrics = new kr::RouterMetrics;
  kr::RouterOptions o;
  o.workers.push_back({"nobody", "127.0.0.1", 1, 2});
  o.metrics = metrics;
  o.admission.max_queued = 0;  // the worker never answers: refuse at once rather than queue
  core = new kr::RouterCore(o);
  core->Start();
  kvserve::frontend::FrontOptions f;
  f.host = "127.0.0.1";
  f.port = 0;
  f.served_model_name = "fuzz";
  f.max_model_len = 512;
  f.admin_token = "admin";
  f.limits.max_prompt_bytes = 1 << 16;
  f.limits.max_prompt_ids = 512;
  auto started = kvserve::frontend::HttpFront::Start(f, tokenizer.get(), core, metrics);
  if (!started.ok()) abort();
  front = std::move(*started);
  port = front->port();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval timeout{2, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) abort();  // the router died
  for (size_t at = 0; at < size;) {
    const ssize_t n = send(fd, data + at, size - at, MSG_NOSIGNAL);
    if (n <= 0) break;  // the router closed early (a bad request)
    at += static_cast<size_t>(n);
  }
  shutdown(fd, SHUT_WR);
  char buf[4096];
  while (recv(fd, buf, sizeof(buf), 0) > 0) {
  }
  close(fd);
  return 0;
}
