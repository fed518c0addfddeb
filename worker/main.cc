// kvserve-worker: one tensor-parallel group serving token ids over ZeroMQ, with KV events,
// status heartbeats, Prometheus metrics, probes, drain on SIGTERM and planned recycling
// (re-exec after a granted drain). See worker/server/worker_server.h for the protocol.
//
//   kvserve-worker --model DIR --port 5570 --events-port 5571 --metrics-port 8090 [engine flags]
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <csignal>
#include <cstdlib>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/file_util.h"
#include "common/init.h"
#include "common/net/curve.h"
#include "common/status_macros.h"
#include "frontend/http/front_flags.h"
#include "glog/logging.h"
#include "nlohmann/json.hpp"
#include "worker/engine_flags.h"
#include "worker/openai/openai_front.h"
#include "worker/server/worker_server.h"

ABSL_FLAG(std::string, host, "127.0.0.1",
          "Address the ZeroMQ sockets bind to (0.0.0.0: every interface). Other than loopback it "
          "needs CURVE keys (--curve-secret-key-file) or --insecure");
ABSL_FLAG(std::string, curve_secret_key_file, "",
          "This worker's CURVE secret key (kvserve-keygen); with it every ZeroMQ connection is "
          "authenticated and encrypted, and only keys in --curve-allowed-clients-dir get in");
ABSL_FLAG(std::string, curve_allowed_clients_dir, "",
          "Directory of the routers' public keys, one file each (re-read within a second of a "
          "change)");
ABSL_FLAG(bool, insecure, false,
          "Allow a non-loopback --host without CURVE keys: anyone who reaches the ZeroMQ ports "
          "can submit, abort, drain and recycle (docs/SECURITY.md)");
ABSL_FLAG(std::string, metrics_host, "",
          "Address of /metrics, /health and /ready (default: --host)");
ABSL_FLAG(int32_t, port, 5570,
          "ZeroMQ ROUTER port: requests, streamed responses, aborts, control (0: any)");
ABSL_FLAG(int32_t, events_port, 5571, "ZeroMQ PUB port: KV events and status heartbeats (0: any)");
ABSL_FLAG(int32_t, link_port, -1,
          "TCP port of the framed link: --port's messages without ZeroMQ, for routers started "
          "with --worker-link=tcp (-1: none; 0: any). Not authenticated: refused with CURVE keys");
ABSL_FLAG(int32_t, metrics_port, 8090, "HTTP port: /metrics, /health, /ready (0: any)");
ABSL_FLAG(std::string, worker_id, "",
          "Stable id in events, heartbeats and metrics (default: host:port)");
ABSL_FLAG(int32_t, heartbeat_ms, 250, "Status heartbeat period");
ABSL_FLAG(int32_t, load_report_interval_ms, 50,
          "While the load changes, a status with the load report this often (routers' estimate "
          "of every replica's placements; docs/ROUTING.md)");
ABSL_FLAG(double, drain_timeout, 30, "Seconds in-flight requests may take to finish when draining");
ABSL_FLAG(int32_t, recycle_grant_hold_ms, 1000,
          "A recycle grant stays revocable this long before the worker commits to it (several "
          "router replicas resolve concurrent grants meanwhile); at least 3 heartbeats");
ABSL_FLAG(int64_t, recycle_after_requests, 0,
          "Ask for a recycle after this many requests (0: off)");
ABSL_FLAG(double, recycle_after_seconds, 0, "Ask for a recycle after this uptime (0: off)");
ABSL_FLAG(double, recycle_on_rss_growth_mb, 0,
          "Ask for a recycle when resident memory grew this much (0: off)");
ABSL_FLAG(double, recycle_on_fragmentation, 0,
          "Ask for a recycle when this fraction of allocated KV slots is unused (0: off)");
ABSL_FLAG(std::string, ports_file, "", "Write the bound ports as JSON here once ready");
ABSL_FLAG(std::string, kv_events_config, "",
          "vLLM's KV events as vLLM's --kv-events-config (JSON: enable_kv_cache_events, "
          "publisher, endpoint, replay_endpoint, buffer_steps, hwm, max_queue_size, topic), "
          "beside kvserve's own on --events-port; an endpoint off loopback needs --insecure "
          "(docs/INTEROP.md)");
ABSL_FLAG(std::string, kv_events_encoding, "map",
          "vLLM KV events' encoding: map (vLLM 0.24 on: events as maps tagged by type) or array "
          "(vLLM up to 0.23: tagged arrays)");
ABSL_FLAG(std::string, role, "both",
          "Disaggregated serving (docs/DISAGGREGATION.md): prefill (routers send it only the "
          "prefill of long prompts, whose KV decode workers then pull), decode (it decodes, and "
          "prefills short prompts itself) or both");
ABSL_FLAG(int32_t, openai_port, -1,
          "Serve the OpenAI API here as well (chat, completions, /tokenize, /v1/models, /metrics "
          "with vLLM's names): the worker as a vLLM-like pod for a gateway or another router; "
          "the router's front flags (--api-keys-file, --tool-call-parser, ...) apply (-1: off, "
          "0: any port)");
ABSL_FLAG(std::string, openai_host, "",
          "Address of the --openai-port API (default: --host); other than loopback it needs "
          "--api-keys or --api-keys-file, or --insecure");
ABSL_FLAG(bool, vllm_metric_names, true,
          "Also publish vLLM's metric names (vllm:*); promtool's linter flags their ':'");

namespace {

std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop = true; }

// The worker's planned recycles so far, carried over each re-exec in this variable as
// "reason=count,...", so that kvserve_recycles_total does not restart with the process.
constexpr char kRecyclesEnv[] = "KVSERVE_RECYCLES";

std::map<std::string, int64_t> EarlierRecycles() {
  std::map<std::string, int64_t> counts;
  const char* env = std::getenv(kRecyclesEnv);
  for (absl::string_view item : absl::StrSplit(env ? env : "", ',', absl::SkipEmpty())) {
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(item, '=');
    int64_t n = 0;
    if (!kv.first.empty() && absl::SimpleAtoi(kv.second, &n) && n > 0)
      counts[std::string(kv.first)] += n;
  }
  return counts;
}

void RecordRecycle(const std::string& reason) {
  std::map<std::string, int64_t> counts = EarlierRecycles();
  // The reason may come from the network: only [A-Za-z0-9_], at most 32, keep the format intact.
  std::string name;
  for (char c : reason.substr(0, 32)) name += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  ++counts[name.empty() ? "recycle" : name];
  std::vector<std::string> items;
  for (const auto& [r, n] : counts) items.push_back(absl::StrCat(r, "=", n));
  setenv(kRecyclesEnv, absl::StrJoin(items, ",").c_str(), 1);
}

}  // namespace

namespace kvserve::worker {

// CURVE keys, or the loopback / --insecure rule when there are none.
absl::Status CurveFromFlags(WorkerServerOptions* o) {
  const std::string key_file = absl::GetFlag(FLAGS_curve_secret_key_file);
  const std::string clients = absl::GetFlag(FLAGS_curve_allowed_clients_dir);
  if (key_file.empty() != clients.empty()) {
    return absl::InvalidArgumentError(
        "--curve-secret-key-file and --curve-allowed-clients-dir go together");
  }
  if (key_file.empty()) {
    if (IsLoopbackHost(o->host)) {
      LOG(INFO) << "ZeroMQ sockets unauthenticated (no CURVE keys): listening on loopback only";
      return absl::OkStatus();
    }
    if (!absl::GetFlag(FLAGS_insecure)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--host ", o->host,
          " is not loopback: give CURVE keys (--curve-secret-key-file and "
          "--curve-allowed-clients-dir, made with kvserve-keygen) or pass --insecure"));
    }
    LOG(WARNING) << "--insecure: ZeroMQ sockets on " << o->host
                 << " are unauthenticated; whoever reaches them can submit, abort, drain and "
                    "recycle";
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(CurveKeyPair own, ReadCurveKeyPair(key_file));
  RETURN_IF_ERROR(ReadAllowedClients(clients).status());  // before the weights load
  o->curve_secret_key = own.secret_key;
  o->curve_allowed_clients_dir = clients;
  LOG(INFO) << "CURVE on: this worker's public key is " << own.public_key;
  return absl::OkStatus();
}

// vLLM's KV events, when --kv-events-config asks for them. Their sockets cannot use CURVE
// (vLLM's consumers do not speak it) and carry the prompts' token ids: off loopback they need
// --insecure, like the other sockets without keys.
absl::Status VllmEventsFromFlags(WorkerServerOptions* o) {
  const std::string text = absl::GetFlag(FLAGS_kv_events_config);
  ASSIGN_OR_RETURN(o->vllm_events_encoding,
                   vllm_events::ParseEncoding(absl::GetFlag(FLAGS_kv_events_encoding)));
  if (text.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(VllmEventsConfig c, ParseVllmEventsConfig(text));
  if (!c.publishes()) return absl::OkStatus();
  for (const std::optional<std::string>& ep : {std::optional(c.endpoint), c.replay_endpoint}) {
    if (!ep || ep->rfind("ipc://", 0) == 0 || ep->rfind("inproc://", 0) == 0) continue;
    const std::string host = ep->substr(6, ep->rfind(':') - 6);
    if (IsLoopbackHost(host) || absl::GetFlag(FLAGS_insecure)) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        "--kv-events-config: ", *ep,
        " is off loopback: vLLM's event sockets carry the prompts' "
        "token ids unauthenticated (vLLM's consumers speak no CURVE); bind them to 127.0.0.1, or "
        "pass --insecure on a network you trust"));
  }
  o->vllm_events = std::move(c);
  return absl::OkStatus();
}

// The server's options from the flags; checked before the engine loads its weights.
absl::StatusOr<WorkerServerOptions> OptionsFromFlags() {
  WorkerServerOptions o;
  o.host = absl::GetFlag(FLAGS_host);
  o.metrics_host =
      absl::GetFlag(FLAGS_metrics_host).empty() ? o.host : absl::GetFlag(FLAGS_metrics_host);
  o.port = absl::GetFlag(FLAGS_port);
  o.events_port = absl::GetFlag(FLAGS_events_port);
  o.link_port = absl::GetFlag(FLAGS_link_port);
  if (o.link_port < -1 || o.link_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--link-port ", o.link_port, ": give a port, 0 (any) or -1 (none)"));
  }
  o.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  o.heartbeat = absl::Milliseconds(absl::GetFlag(FLAGS_heartbeat_ms));
  if (absl::GetFlag(FLAGS_load_report_interval_ms) < 1) {
    return absl::InvalidArgumentError("--load-report-interval-ms must be >= 1");
  }
  o.load_report_interval = absl::Milliseconds(absl::GetFlag(FLAGS_load_report_interval_ms));
  o.drain_timeout = absl::Seconds(absl::GetFlag(FLAGS_drain_timeout));
  o.recycle_grant_hold = absl::Milliseconds(absl::GetFlag(FLAGS_recycle_grant_hold_ms));
  if (o.recycle_grant_hold < 3 * o.heartbeat) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--recycle-grant-hold-ms ", absl::GetFlag(FLAGS_recycle_grant_hold_ms),
        " must be at least 3 heartbeats (--heartbeat-ms ", absl::GetFlag(FLAGS_heartbeat_ms), ")"));
  }
  o.recycle = {
      absl::GetFlag(FLAGS_recycle_after_requests), absl::GetFlag(FLAGS_recycle_after_seconds),
      absl::GetFlag(FLAGS_recycle_on_rss_growth_mb), absl::GetFlag(FLAGS_recycle_on_fragmentation)};
  o.vllm_metric_names = absl::GetFlag(FLAGS_vllm_metric_names);
  o.earlier_recycles = EarlierRecycles();
  o.role = absl::GetFlag(FLAGS_role);
  if (o.role != "prefill" && o.role != "decode" && o.role != "both") {
    return absl::InvalidArgumentError(
        absl::StrCat("--role '", o.role, "': give prefill, decode or both"));
  }
  RETURN_IF_ERROR(CurveFromFlags(&o));
  RETURN_IF_ERROR(CheckLinkOptions(o));
  RETURN_IF_ERROR(VllmEventsFromFlags(&o));
  o.worker_id = absl::GetFlag(FLAGS_worker_id);
  if (o.worker_id.empty()) {
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    o.worker_id = absl::StrCat(host, ":", o.port);
  }
  return o;
}

// --openai-port's front, its options from the flags (nullopt when off). With CURVE on, makes the
// front's key pair and lets the worker's ZAP handler allow it.
struct OpenAiSetup {
  OpenAiFrontOptions options;
  frontend::FrontOptions front;
};

absl::StatusOr<std::optional<OpenAiSetup>> OpenAiFromFlags(const WorkerServerOptions& o,
                                                           const EngineConfig& c,
                                                           int max_model_len) {
  const int port = absl::GetFlag(FLAGS_openai_port);
  if (port < 0) return std::nullopt;
  if (port > 65535) return absl::InvalidArgumentError("--openai-port must be in 0..65535");
  OpenAiSetup s;
  s.options.model_dir = c.model_dir;
  s.front.host =
      absl::GetFlag(FLAGS_openai_host).empty() ? o.host : absl::GetFlag(FLAGS_openai_host);
  s.front.port = port;
  s.front.model_root = c.model_dir;
  s.front.served_model_name = c.model_id;
  RETURN_IF_ERROR(frontend::FrontFromFlags(max_model_len, &s.front, &s.options.core.admission));
  if (!IsLoopbackHost(s.front.host) && s.front.api_keys.empty() && !absl::GetFlag(FLAGS_insecure)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--openai-host ", s.front.host,
                     " is not loopback: give --api-keys or --api-keys-file, or pass --insecure"));
  }
  // The link to this worker: its own address, loopback when it listens on every interface.
  s.options.core.host = o.host == "0.0.0.0" ? "127.0.0.1" : o.host;
  s.options.core.name = "self";
  return s;
}

// With CURVE on, the front's link authenticates with a key pair made now, which the worker's
// ZAP handler allows beside its directory's keys.
absl::Status AddFrontKeys(OpenAiSetup* s, WorkerServerOptions* o) {
  if (o->curve_secret_key.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(CurveKeyPair own, ReadCurveKeyPair(absl::GetFlag(FLAGS_curve_secret_key_file)));
  ASSIGN_OR_RETURN(CurveKeyPair front_keys, GenerateCurveKeyPair());
  s->options.core.curve = CurveClientKeys{front_keys, own.public_key};
  o->curve_also_allowed.push_back({"openai-front", front_keys.public_key});
  return absl::OkStatus();
}

// Serves until stopped or recycled; `*drain_reason` says why it drained.
absl::StatusOr<WorkerServer::Exit> Serve(std::string* drain_reason) {
  ASSIGN_OR_RETURN(WorkerServerOptions o, OptionsFromFlags());
  ASSIGN_OR_RETURN(EngineConfig config, EngineConfigFromFlags());
  RETURN_IF_ERROR(OpenAiFromFlags(o, config, std::max(config.max_model_len, 1)).status());
  ASSIGN_OR_RETURN(RunnerTestHooks hooks, TestHooksFromFlags());
  ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(config, hooks));
  std::cerr << engine->preflight_report() << "\n";
  // Warm up: one tiny request through every layer before reporting ready.
  RETURN_IF_ERROR(engine->AddRequest({.request_id = "warmup", .prompt = {0}, .max_tokens = 1}));
  while (engine->HasWork()) RETURN_IF_ERROR(engine->Step().status());
  if (absl::Status s = engine->PreloadConstraints(); !s.ok()) {
    std::cerr << "kvserve-worker: structured outputs are unavailable: " << s.message() << "\n";
  }

  // Device-to-device KV links where the device has them and the engine moves KV at all.
  if (engine->KvWireBlockBytes() > 0) o.kv_links = MakeKvLinkMaker(engine->config());
  ASSIGN_OR_RETURN(std::optional<OpenAiSetup> openai,
                   OpenAiFromFlags(o, engine->config(), engine->max_model_len()));
  if (openai) RETURN_IF_ERROR(AddFrontKeys(&*openai, &o));
  ASSIGN_OR_RETURN(std::unique_ptr<WorkerServer> server,
                   WorkerServer::Create(o, std::move(engine)));
  nlohmann::json ports = {{"port", server->port()},
                          {"events_port", server->events_port()},
                          {"link_port", server->link_port()},
                          {"metrics_port", server->metrics_port()},
                          {"instance_id", server->instance_id()},
                          {"pid", getpid()}};
  std::unique_ptr<OpenAiFront> front;
  if (openai) {
    openai->front.more_metrics = [s = server.get()] { return s->SerializeMetrics(); };
    openai->options.core.port = server->port();
    openai->options.core.events_port = server->events_port();
    ASSIGN_OR_RETURN(front, OpenAiFront::Start(openai->options, openai->front));
    ports["openai_port"] = front->port();
    server->set_http_endpoint(absl::StrCat(":", front->port()));
  }
  if (const std::string f = absl::GetFlag(FLAGS_ports_file); !f.empty()) {
    RETURN_IF_ERROR(WriteFileAtomically(f, ports.dump() + "\n"));
  }
  std::cout << "kvserve-worker ready " << ports.dump() << std::endl;
  absl::StatusOr<WorkerServer::Exit> exit = server->Run(&g_stop);
  // Drained: the front's streams have ended; what is still open is closed.
  if (front) front->Stop(absl::Seconds(1));
  *drain_reason = server->drain_reason();
  return exit;
}

}  // namespace kvserve::worker

int main(int argc, char** argv) {
  std::vector<std::string> original(argv, argv + argc);
  const std::vector<char*> positional = kvserve::InitProgram(
      argc, argv,
      "kvserve-worker [MODEL | --model DIR] [--port P --events-port E --metrics-port M] "
      "[engine flags]");
  if (absl::Status s = kvserve::worker::TakePositionalModel(positional); !s.ok()) {
    std::cerr << "kvserve-worker: " << s.message() << "\n";
    return 1;
  }
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGINT, OnSignal);
  std::string drain_reason;
  absl::StatusOr<kvserve::worker::WorkerServer::Exit> exit = kvserve::worker::Serve(&drain_reason);
  if (!exit.ok()) {
    std::cerr << "kvserve-worker: " << exit.status().message() << "\n";
    return 1;
  }
  if (*exit == kvserve::worker::WorkerServer::Exit::kRecycle) {
    // A fresh process and a fresh device context; the sockets are closed by now.
    std::cerr << "kvserve-worker: recycling (re-exec)\n";
    RecordRecycle(drain_reason);
    std::vector<char*> args;
    for (std::string& a : original) args.push_back(a.data());
    args.push_back(nullptr);
    execv("/proc/self/exe", args.data());
    std::cerr << "kvserve-worker: re-exec failed: " << std::strerror(errno) << "\n";
    return 1;
  }
  return 0;
}
