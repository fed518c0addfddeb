// What a worker reads from anyone who reaches its ROUTER socket (worker/server/worker_server.h):
// messages in the form of frames.h (GenerateRequest, AbortRequest, Control, the KV transfer's
// KvExportRequest and KvChunk, LinkSubscribe, or an unknown type, arbitrary payloads) handed to a
// real WorkerServer with the tiny CPU model, as its loop hands them on. The same bytes also come
// as a framed link's stream (common/net/frame_link.h, over a socket pair), and whatever messages
// it yields are handed on too. Each generate request is aborted after the input (the engine never
// runs a step, so inputs stay cheap) and a drain is lifted; nothing may fault.
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "common/net/frame_link.h"
#include "tests/fuzz/frames.h"
#include "tests/fuzz/fuzz_env.h"
#include "worker/server/worker_server.h"

namespace pb = ::kvserve::v1;
namespace kw = ::kvserve::worker;

namespace {

constexpr const char* kTypes[] = {"GenerateRequest", "AbortRequest", "Control",      "KvSnapshot",
                                  "KvExportRequest", "KvChunk",      "LinkSubscribe"};

// The messages a framed link reads from `data` (up to a break), as the worker's link server
// would read them from a connection.
std::vector<kvserve::ReceivedMessage> FromLink(const uint8_t* data, size_t size) {
  std::vector<kvserve::ReceivedMessage> got;
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) return got;
  const bool whole = write(fds[0], data, size) == static_cast<ssize_t>(size);
  close(fds[0]);
  kvserve::FrameLink link(fds[1], {.max_message_bytes = 1 << 20});
  while (whole && link.Read(got, 64).ok() && got.size() < 256) {
  }
  return got;
}
kw::WorkerServer* server = nullptr;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  kw::EngineConfig config;
  config.model_dir = kvserve::fuzz::DirFromEnv("KVSERVE_FUZZ_MODEL");
  config.max_model_len = 128;
  config.cache.num_blocks = 64;
  auto engine = kw::Engine::Create(config);
  if (!engine.ok()) abort();
  kw::WorkerServerOptions o;
  o.worker_id = "fuzz";
  auto s = kw::WorkerServer::Create(o, std::move(*engine));
  if (!s.ok()) abort();
  server = s->release();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> started;
  for (const kvserve::fuzz::Record& r : kvserve::fuzz::ReadRecords(data, size)) {
    const char* type = kTypes[r.type % std::size(kTypes)];
    server->HandleMessage({"peer", type, r.payload});
    pb::GenerateRequest g;
    if (type == kTypes[0] && g.ParseFromString(r.payload)) started.push_back(g.request_id());
  }
  for (const kvserve::ReceivedMessage& m : FromLink(data, size)) {
    server->HandleMessage({"peer", m.type, m.payload});
    pb::GenerateRequest g;
    if (m.type == kTypes[0] && g.ParseFromString(m.payload)) started.push_back(g.request_id());
  }
  for (const std::string& id : started) {
    pb::AbortRequest a;
    a.set_request_id(id);
    server->HandleMessage({"peer", "AbortRequest", a.SerializeAsString()});
  }
  pb::Control undrain;
  undrain.set_action(pb::CONTROL_ACTION_UNDRAIN);
  server->HandleMessage({"peer", "Control", undrain.SerializeAsString()});
  return 0;
}
