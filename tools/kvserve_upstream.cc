// kvserve-upstream: an OpenAI-compatible server kvserve does not run (vLLM, SGLang, another
// kvserve) presented to kvserve-router as one more worker: requests by token ids over its
// /v1/completions, its cache from its vLLM-format KV events, its load from its /metrics
// (upstream/upstream_bridge.h, docs/INTEROP.md). Run one beside each such server and
// list it in the router's --workers like a worker.
//
//   kvserve-upstream --url http://127.0.0.1:8000 --kv-events-endpoint tcp://127.0.0.1:5557
//     --kv-replay-endpoint tcp://127.0.0.1:5558 --port 5570 --events-port 5571
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/init.h"
#include "common/net/curve.h"
#include "common/net/http_server.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "nlohmann/json.hpp"
#include "upstream/upstream_bridge.h"

ABSL_FLAG(std::string, url, "", "The upstream's OpenAI API: http://HOST:PORT");
ABSL_FLAG(std::string, model, "", "The model name to ask it for (default: its first /v1/models)");
ABSL_FLAG(std::string, kv_events_endpoint, "",
          "Its vLLM KV-event PUB socket (vLLM's --kv-events-config endpoint, e.g. "
          "tcp://10.0.0.5:5557); empty: no view of its cache");
ABSL_FLAG(std::string, kv_replay_endpoint, "",
          "Its replay socket (replay_endpoint); empty: events from when this starts only");
ABSL_FLAG(std::string, kv_events_topic, "", "Its events' topic (\"\": any)");
ABSL_FLAG(bool, kv_events_bind, false,
          "Bind --kv-events-endpoint rather than connect to it: for an engine configured to "
          "connect its publisher out (as llm-d deploys vLLM)");
ABSL_FLAG(int32_t, data_parallel_size, 1,
          "Its data-parallel engines (vLLM's --data-parallel-size): rank r's events and replays "
          "are read at the endpoints' port + r");
ABSL_FLAG(int32_t, block_size, 0, "Its KV block size (0: from vllm:cache_config_info)");
ABSL_FLAG(int32_t, max_concurrency, 256,
          "Requests it takes at once from each router (reported as max_num_seqs)");
ABSL_FLAG(std::string, name, "", "The worker id routers see (default: the --url's host:port)");
ABSL_FLAG(std::string, host, "127.0.0.1",
          "Address of the worker-protocol sockets; other than loopback it needs CURVE keys or "
          "--insecure, as kvserve-worker's");
ABSL_FLAG(int32_t, port, 5570, "ZeroMQ ROUTER port (0: any)");
ABSL_FLAG(int32_t, events_port, 5571, "ZeroMQ PUB port (0: any)");
ABSL_FLAG(int32_t, metrics_port, 8091,
          "HTTP port of /metrics (kvserve_upstream_*), /health and /ready (0: any; -1: off)");
ABSL_FLAG(std::string, metrics_host, "",
          "Address of /metrics, /health and /ready (default: --host)");
ABSL_FLAG(std::string, curve_secret_key_file, "", "CURVE secret key, as kvserve-worker's");
ABSL_FLAG(std::string, curve_allowed_clients_dir, "", "Routers' public keys, as kvserve-worker's");
ABSL_FLAG(bool, insecure, false, "Allow a non-loopback --host without CURVE keys");
ABSL_FLAG(int32_t, scrape_interval_ms, 500, "How often its /metrics is read");
ABSL_FLAG(std::string, ports_file, "", "Write the bound ports as JSON here once listening");

namespace {
std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop = true; }
}  // namespace

namespace kvserve::upstream {

absl::StatusOr<UpstreamBridgeOptions> OptionsFromFlags() {
  UpstreamBridgeOptions o;
  ASSIGN_OR_RETURN(o.api, ParseUrl(absl::GetFlag(FLAGS_url)));
  o.model = absl::GetFlag(FLAGS_model);
  o.events_endpoint = absl::GetFlag(FLAGS_kv_events_endpoint);
  o.replay_endpoint = absl::GetFlag(FLAGS_kv_replay_endpoint);
  o.topic = absl::GetFlag(FLAGS_kv_events_topic);
  o.events_bind = absl::GetFlag(FLAGS_kv_events_bind);
  o.data_parallel_size = absl::GetFlag(FLAGS_data_parallel_size);
  o.block_size = absl::GetFlag(FLAGS_block_size);
  o.max_concurrency = absl::GetFlag(FLAGS_max_concurrency);
  o.name = absl::GetFlag(FLAGS_name).empty() ? absl::StrCat(o.api.host, ":", o.api.port)
                                             : absl::GetFlag(FLAGS_name);
  o.host = absl::GetFlag(FLAGS_host);
  o.port = absl::GetFlag(FLAGS_port);
  o.events_port = absl::GetFlag(FLAGS_events_port);
  if (absl::GetFlag(FLAGS_scrape_interval_ms) < 10) {
    return absl::InvalidArgumentError("--scrape-interval-ms must be at least 10");
  }
  o.scrape = absl::Milliseconds(absl::GetFlag(FLAGS_scrape_interval_ms));
  const std::string key = absl::GetFlag(FLAGS_curve_secret_key_file);
  const std::string clients = absl::GetFlag(FLAGS_curve_allowed_clients_dir);
  if (key.empty() != clients.empty()) {
    return absl::InvalidArgumentError(
        "--curve-secret-key-file and --curve-allowed-clients-dir go together");
  }
  if (!key.empty()) {
    ASSIGN_OR_RETURN(CurveKeyPair own, ReadCurveKeyPair(key));
    o.curve_secret_key = own.secret_key;
    o.curve_allowed_clients_dir = clients;
  } else if (!IsLoopbackHost(o.host) && !absl::GetFlag(FLAGS_insecure)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--host ", o.host, " is not loopback: give CURVE keys or pass --insecure"));
  }
  return o;
}

absl::Status Serve() {
  ASSIGN_OR_RETURN(UpstreamBridgeOptions o, OptionsFromFlags());
  ASSIGN_OR_RETURN(std::unique_ptr<UpstreamBridge> bridge, UpstreamBridge::Create(o));
  nlohmann::json ports = {
      {"port", bridge->port()}, {"events_port", bridge->events_port()}, {"pid", getpid()}};
  std::unique_ptr<HttpServer> http;
  if (absl::GetFlag(FLAGS_metrics_port) >= 0) {
    const std::string host =
        absl::GetFlag(FLAGS_metrics_host).empty() ? o.host : absl::GetFlag(FLAGS_metrics_host);
    ASSIGN_OR_RETURN(
        http,
        HttpServer::Start(host, absl::GetFlag(FLAGS_metrics_port),
                          [b = bridge.get()](const std::string& method, const std::string& target) {
                            HttpResponse r;
                            if (method != "GET") {
                              r.status = 405;
                            } else if (target == "/metrics") {
                              r.content_type = "text/plain; version=0.0.4; charset=utf-8";
                              r.body = b->SerializeMetrics();
                            } else if (target == "/health") {
                              r.body = "ok\n";
                            } else if (target == "/ready") {
                              r.status = b->ready_now() ? 200 : 503;
                              r.body = b->ready_now() ? "ready\n" : "not ready\n";
                            } else {
                              r.status = 404;
                            }
                            return r;
                          }));
    ports["metrics_port"] = http->port();
  }
  if (const std::string f = absl::GetFlag(FLAGS_ports_file); !f.empty()) {
    RETURN_IF_ERROR(WriteFileAtomically(f, ports.dump() + "\n"));
  }
  std::cout << "kvserve-upstream ready " << ports.dump() << std::endl;
  return bridge->Run(&g_stop);
}

}  // namespace kvserve::upstream

int main(int argc, char** argv) {
  kvserve::InitProgram(argc, argv,
                       "kvserve-upstream --url http://HOST:PORT [--kv-events-endpoint EP "
                       "--kv-replay-endpoint EP] [--port P --events-port E]");
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGINT, OnSignal);
  if (absl::Status s = kvserve::upstream::Serve(); !s.ok()) {
    std::cerr << "kvserve-upstream: " << s.message() << "\n";
    return 1;
  }
  return 0;
}
