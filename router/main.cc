// kvserve-router: the HTTP front door. Tokenizes, hashes prompt blocks, routes each request to
// the worker that caches its prefix (or the least loaded), streams OpenAI-style responses.
//
//   kvserve-router --model DIR --workers 127.0.0.1:5570:5571,127.0.0.1:5580:5581 --port 8000
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <iostream>

#include "absl/cleanup/cleanup.h"
#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/file_util.h"
#include "common/init.h"
#include "common/model/hf_config.h"
#include "common/net/curve.h"
#include "common/status_macros.h"
#include "epp/endpoint_picker.h"
#include "frontend/http/front_flags.h"
#include "frontend/http/http_front.h"
#include "glog/logging.h"
#include "router/fleet_vllm_metrics.h"
#include "router/router_core.h"
#include "router/router_metrics.h"
#include "router/routing_flags.h"

ABSL_FLAG(std::string, model, "", "Model directory: tokenizer files and config.json (max length)");
ABSL_FLAG(std::string, served_model_name, "",
          "Model name clients use (default: the directory name)");
ABSL_FLAG(std::string, workers, "", "Workers as HOST:PORT:EVENTS_PORT, comma-separated");
ABSL_FLAG(std::string, workers_dns, "",
          "Discover workers as NAME:PORT:EVENTS_PORT: every address NAME resolves to (a Kubernetes "
          "headless Service) is a worker; re-resolved every --dns-refresh-seconds");
ABSL_FLAG(double, dns_refresh_seconds, 10.0, "How often --workers-dns is resolved again");
ABSL_FLAG(std::string, host, "127.0.0.1",
          "HTTP address (0.0.0.0: every interface, as in a container)");
ABSL_FLAG(int32_t, port, 8000, "HTTP port (0: any; the chosen one is printed)");
ABSL_FLAG(int32_t, max_model_len, 0,
          "Longest prompt + output (0: the model's max_position_embeddings)");
ABSL_FLAG(bool, vllm_metrics, true,
          "/metrics also serves the workers' vllm:* families, summed, read from each worker's "
          "/metrics when the router's is read (fleet_vllm_metrics.h)");
ABSL_FLAG(double, vllm_metrics_timeout_seconds, 1.0,
          "How long a read of one worker's /metrics for --vllm-metrics may take");
ABSL_FLAG(double, heartbeat_timeout_seconds, 2.0, "A worker silent this long is out of rotation");
ABSL_FLAG(std::string, router_id, "",
          "This replica's id among the fleet's routers: in recycle grants, and (with a suffix "
          "unique per start) on its placements, which workers' load reports count per replica "
          "(default: the host name)");
ABSL_FLAG(int32_t, max_unavailable, 1,
          "Recycle coordinator: most workers draining or recycling at once");
ABSL_FLAG(std::string, curve_secret_key_file, "",
          "This router's CURVE secret key (kvserve-keygen): the links to workers are "
          "authenticated and encrypted; the workers must list its public key");
ABSL_FLAG(std::string, curve_server_key_file, "",
          "The workers' CURVE public key (or their secret-key file)");
ABSL_FLAG(std::string, worker_link, "zmq",
          "How requests and replies travel to workers: zmq (each worker's ZeroMQ --port), or tcp "
          "(the framed link of workers started with --link-port, ZeroMQ for those without; "
          "fewer system calls per message; no CURVE: refused with --curve-secret-key-file)");
ABSL_FLAG(double, shutdown_timeout_seconds, 30,
          "On SIGTERM the router takes no new connection and waits this long at most for those "
          "open to finish");
ABSL_FLAG(std::string, ports_file, "",
          "Write {\"port\": HTTP port, \"pid\": PID} as JSON here once listening (and "
          "\"epp_port\" with --epp-port)");
ABSL_FLAG(bool, kv_fetch, false,
          "Peer prefix fetch: a request routed to a worker that lacks a prefix another worker "
          "caches further pulls those KV blocks from it when moving them beats prefilling them "
          "(docs/DISAGGREGATION.md)");
ABSL_FLAG(int32_t, kv_fetch_min_blocks, 4, "--kv-fetch: the fewest blocks worth a fetch");
ABSL_FLAG(bool, kv_fetch_in_policy, true,
          "--kv-fetch with --policy cost: weigh the fetch each worker would make when picking "
          "one (--route-fetch-weight); false: fetch only for the worker picked without it");
ABSL_FLAG(double, kv_fetch_timeout_seconds, 2,
          "--kv-fetch: one attempt's time (plus twice the transfer's estimate); a fetch that "
          "fails is tried once more, then its request prefills");
ABSL_FLAG(double, kv_fetch_gbps, 1.0,
          "--kv-fetch: the link rate assumed (GB/s) until transfers measure it");
ABSL_FLAG(int32_t, kv_fetch_chunk_bytes, 4 << 20, "--kv-fetch: the most bytes of blocks a chunk");
ABSL_FLAG(bool, kv_links, false,
          "Pair the workers that join device-to-device KV links (CUDA workers: NCCL, a link per "
          "tensor-parallel rank) "
          "and send fetched and disaggregated KV over them; the relay stays the fallback");
ABSL_FLAG(double, kv_link_timeout_seconds, 30,
          "--kv-links: the bound on a link's join and on each transfer's wait at the workers");
ABSL_FLAG(bool, kv_link_stream_layers, true,
          "--kv-links: a disaggregated request's prefill streams its KV over an idle link layer "
          "by layer as it computes it; false: the decode worker pulls the blocks once the "
          "prefill ended");
ABSL_FLAG(int64_t, max_local_prefill_tokens, 1000,
          "With prefill workers (kvserve-worker --role prefill): a request whose decode worker "
          "would prefill more than this many tokens is prefilled on a prefill worker, and its "
          "decode worker pulls the KV (docs/DISAGGREGATION.md)");
ABSL_FLAG(int32_t, epp_port, -1,
          "Serve as a Gateway API Inference Extension endpoint picker: Envoy's ext_proc v3 gRPC "
          "and gRPC health on this port (9002 as the extension's pickers; 0: any; -1: off)");
ABSL_FLAG(std::string, epp_host, "", "The endpoint picker's address (default: --host)");
ABSL_FLAG(int32_t, epp_fallbacks, 2,
          "Endpoints the picker names after its pick, for the gateway's retries (0..16)");
ABSL_FLAG(std::string, epp_request_body_mode, "FULL_DUPLEX_STREAMED",
          "The gateway's ext_proc request_body_mode when its stream does not say (Envoy before "
          "1.35): FULL_DUPLEX_STREAMED, BUFFERED or NONE");
ABSL_FLAG(std::string, epp_response_body_mode, "NONE",
          "The gateway's ext_proc response_body_mode when its stream does not say: NONE, "
          "STREAMED, BUFFERED or FULL_DUPLEX_STREAMED");

namespace {
std::atomic<bool> g_stop{false};
// SIGTERM / SIGINT write a byte here; the main thread sleeps in a read of it (it polled every
// 50 ms, a tenth of an idle router's wake-ups).
int g_stop_pipe[2] = {-1, -1};

void OnSignal(int) {
  g_stop = true;
  (void)!write(g_stop_pipe[1], "x", 1);
}

void WaitForStop() {
  char c;
  while (!g_stop) (void)!read(g_stop_pipe[0], &c, 1);
}
}  // namespace

namespace kvserve::router {

namespace ext_proc = ::envoy::service::ext_proc::v3;
using epp::EndpointPicker;
using epp::EndpointPickerOptions;
using epp::PickOptions;
using frontend::FrontOptions;
using frontend::HttpFront;

absl::StatusOr<std::optional<CurveClientKeys>> CurveFromFlags() {
  const std::string own = absl::GetFlag(FLAGS_curve_secret_key_file);
  const std::string server = absl::GetFlag(FLAGS_curve_server_key_file);
  if (own.empty() != server.empty()) {
    return absl::InvalidArgumentError(
        "--curve-secret-key-file and --curve-server-key-file go together");
  }
  if (own.empty()) {
    LOG(INFO) << "links to workers unauthenticated (no CURVE keys): workers must run on "
                 "loopback or with --insecure";
    return std::nullopt;
  }
  CurveClientKeys keys;
  ASSIGN_OR_RETURN(keys.own, ReadCurveKeyPair(own));
  ASSIGN_OR_RETURN(keys.server_key, ReadCurvePublicKey(server));
  LOG(INFO) << "CURVE on: this router's public key is " << keys.own.public_key;
  return keys;
}

// --epp-*: the endpoint picker's options (nullopt with --epp-port -1).
absl::StatusOr<KvFetchConfig> KvFetchFromFlags() {
  KvFetchConfig c;
  c.enabled = absl::GetFlag(FLAGS_kv_fetch);
  c.min_blocks = absl::GetFlag(FLAGS_kv_fetch_min_blocks);
  c.in_policy = absl::GetFlag(FLAGS_kv_fetch_in_policy);
  const double timeout = absl::GetFlag(FLAGS_kv_fetch_timeout_seconds);
  c.initial_gbps = absl::GetFlag(FLAGS_kv_fetch_gbps);
  const int32_t chunk = absl::GetFlag(FLAGS_kv_fetch_chunk_bytes);
  if (c.min_blocks < 1 || !(timeout > 0) || !(c.initial_gbps > 0) || chunk < 1) {
    return absl::InvalidArgumentError(
        "--kv-fetch-min-blocks, --kv-fetch-timeout-seconds, --kv-fetch-gbps and "
        "--kv-fetch-chunk-bytes must be > 0");
  }
  c.timeout = absl::Seconds(timeout);
  c.max_chunk_bytes = static_cast<uint32_t>(chunk);
  c.links = absl::GetFlag(FLAGS_kv_links);
  c.stream_layers = absl::GetFlag(FLAGS_kv_link_stream_layers);
  const double link_timeout = absl::GetFlag(FLAGS_kv_link_timeout_seconds);
  if (!(link_timeout > 0) || link_timeout > 3600) {
    return absl::InvalidArgumentError(absl::StrCat("--kv-link-timeout-seconds ", link_timeout,
                                                   ": give more than 0 and at most 3600"));
  }
  c.link_timeout = absl::Seconds(link_timeout);
  return c;
}

absl::StatusOr<std::optional<EndpointPickerOptions>> PickerFromFlags(const FrontOptions& f) {
  const int port = absl::GetFlag(FLAGS_epp_port);
  if (port < 0) return std::nullopt;
  if (port > 65535) return absl::InvalidArgumentError("--epp-port must be in 0..65535 (-1: off)");
  EndpointPickerOptions e;
  e.port = port;
  e.host = absl::GetFlag(FLAGS_epp_host).empty() ? f.host : absl::GetFlag(FLAGS_epp_host);
  e.fallbacks = absl::GetFlag(FLAGS_epp_fallbacks);
  auto mode = [](const char* flag, const std::string& name,
                 ext_proc::BodySendMode* m) -> absl::Status {
    if (!ext_proc::BodySendMode_Parse(name, m) || *m == ext_proc::GRPC) {
      return absl::InvalidArgumentError(absl::StrCat(flag, " '", name, "' is not a body mode"));
    }
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(mode("--epp-request-body-mode", absl::GetFlag(FLAGS_epp_request_body_mode),
                       &e.exchange.request_body_mode));
  if (e.exchange.request_body_mode == ext_proc::STREAMED ||
      e.exchange.request_body_mode == ext_proc::BUFFERED_PARTIAL) {
    return absl::InvalidArgumentError(
        "--epp-request-body-mode: a pick needs the whole body before the headers go upstream: "
        "FULL_DUPLEX_STREAMED, BUFFERED or NONE");
  }
  RETURN_IF_ERROR(mode("--epp-response-body-mode", absl::GetFlag(FLAGS_epp_response_body_mode),
                       &e.exchange.response_body_mode));
  e.exchange.max_body_bytes = f.connection.max_body_bytes;
  e.pick = {.max_model_len = f.max_model_len,
            .normalize_prompts = f.normalize_prompts,
            .limits = f.limits};
  return e;
}

// --workers and --workers-dns into `o`; InvalidArgument naming the flag that is wrong.
absl::Status WorkersFromFlags(RouterOptions* o) {
  for (absl::string_view w : absl::StrSplit(absl::GetFlag(FLAGS_workers), ',', absl::SkipEmpty())) {
    std::vector<std::string> parts = absl::StrSplit(w, ':');
    WorkerEndpoint e;
    if (parts.size() != 3 || !absl::SimpleAtoi(parts[1], &e.port) ||
        !absl::SimpleAtoi(parts[2], &e.events_port)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--workers entry '", std::string(w), "' is not HOST:PORT:EVENTS_PORT"));
    }
    e.host = parts[0];
    e.name = std::string(w);
    o->workers.push_back(e);
  }
  if (const std::string dns = absl::GetFlag(FLAGS_workers_dns); !dns.empty()) {
    ASSIGN_OR_RETURN(DnsTarget target, ParseDnsTarget(dns));
    o->workers_dns = target;
    if (!(absl::GetFlag(FLAGS_dns_refresh_seconds) > 0)) {
      return absl::InvalidArgumentError("--dns-refresh-seconds must be > 0");
    }
    o->dns_refresh = absl::Seconds(absl::GetFlag(FLAGS_dns_refresh_seconds));
  }
  if (o->workers.empty() && !o->workers_dns) {
    return absl::InvalidArgumentError("give the workers: --workers or --workers-dns");
  }
  return absl::OkStatus();
}

// SIGTERM: takes no new connection and lets those open finish (their streams end whole) within
// --shutdown-timeout-seconds, the picker's streams alike; then stops the front.
void ShutDown(HttpFront& front, EndpointPicker* epp, const RouterMetrics& metrics) {
  front.StopAccepting();
  const absl::Time give_up =
      absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_shutdown_timeout_seconds));
  // The picker's health turns NOT_SERVING at once; its streams (each a request the gateway is
  // still proxying) get the same time to end.
  if (epp) epp->Stop(give_up - absl::Now());
  while (metrics.open_connections() > 0 && absl::Now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (metrics.open_connections() > 0) {
    LOG(WARNING) << "kvserve-router: " << metrics.open_connections()
                 << " connections still open after --shutdown-timeout-seconds; closing them";
  }
  front.Stop();
}

absl::Status Serve() {
  const std::string model = absl::GetFlag(FLAGS_model);
  if (model.empty()) return absl::InvalidArgumentError("--model DIR is required");
  ASSIGN_OR_RETURN(auto tok, tokenizer::Tokenizer::FromDirectory(model));
  ASSIGN_OR_RETURN(ModelConfig config, LoadHfConfig(model));
  RouterOptions o;
  ASSIGN_OR_RETURN(o.routing, RoutingConfigFromFlags());
  ASSIGN_OR_RETURN(o.curve, CurveFromFlags());
  const std::string link = absl::GetFlag(FLAGS_worker_link);
  if (link != "zmq" && link != "tcp") {
    return absl::InvalidArgumentError(absl::StrCat("--worker-link '", link, "': give zmq or tcp"));
  }
  o.worker_links = link == "tcp";
  if (o.worker_links && o.curve) {
    return absl::InvalidArgumentError(
        "--worker-link=tcp: the framed link carries no CURVE authentication (nor TLS) yet; with "
        "--curve-secret-key-file give --worker-link=zmq");
  }
  ASSIGN_OR_RETURN(o.kv_fetch, KvFetchFromFlags());
  o.max_local_prefill_tokens = absl::GetFlag(FLAGS_max_local_prefill_tokens);
  if (o.max_local_prefill_tokens < 0) {
    return absl::InvalidArgumentError("--max-local-prefill-tokens must be >= 0");
  }
  o.heartbeat_timeout = absl::Seconds(absl::GetFlag(FLAGS_heartbeat_timeout_seconds));
  RETURN_IF_ERROR(WorkersFromFlags(&o));
  FrontOptions f;
  f.host = absl::GetFlag(FLAGS_host);
  f.port = absl::GetFlag(FLAGS_port);
  f.served_model_name = absl::GetFlag(FLAGS_served_model_name);
  f.model_root = model;
  if (f.served_model_name.empty())
    f.served_model_name = std::filesystem::path(model).filename().string();
  o.max_unavailable = absl::GetFlag(FLAGS_max_unavailable);
  o.coordinator_id = absl::GetFlag(FLAGS_router_id);
  if (o.coordinator_id.empty()) {
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    o.coordinator_id = host[0] != 0 ? host : "router";
  }
  RETURN_IF_ERROR(FrontFromFlags(absl::GetFlag(FLAGS_max_model_len) > 0
                                     ? absl::GetFlag(FLAGS_max_model_len)
                                     : static_cast<int>(config.max_position_embeddings),
                                 &f, &o.admission));
  ASSIGN_OR_RETURN(std::optional<EndpointPickerOptions> epp_options, PickerFromFlags(f));
  RouterMetrics metrics;
  o.metrics = &metrics;
  auto core = std::make_unique<RouterCore>(o);
  if (f.api_threads > 0) core->Start();  // else on the front's I/O thread, below
  if (absl::GetFlag(FLAGS_vllm_metrics)) {
    const double timeout = absl::GetFlag(FLAGS_vllm_metrics_timeout_seconds);
    if (!(timeout > 0 && timeout <= 60)) {
      return absl::InvalidArgumentError("--vllm-metrics-timeout-seconds must be in (0, 60]");
    }
    f.more_metrics = [c = core.get(), timeout = absl::Seconds(timeout)] {
      std::vector<MetricsTarget> targets;
      for (const WorkerInfo& w : c->Workers()) {
        if (!w.metrics_endpoint.empty()) targets.push_back({w.name, w.metrics_endpoint});
      }
      return ReadFleetVllmMetrics(targets, timeout);
    };
  }
  ASSIGN_OR_RETURN(std::unique_ptr<HttpFront> front,
                   HttpFront::Start(f, tok.get(), core.get(), &metrics));
  // The core stops before the front's io_context it may run on goes, on every way out.
  absl::Cleanup stop_core = [&] {
    front->Stop();
    if (core != nullptr) core->Stop();
  };
  if (f.api_threads == 0) core->StartOn(front->io());
  std::unique_ptr<EndpointPicker> epp;
  if (epp_options) {
    ASSIGN_OR_RETURN(epp, EndpointPicker::Start(*epp_options, tok.get(), core.get(), &metrics));
    LOG(INFO) << "kvserve-router endpoint picker (ext_proc v3) on " << epp_options->host << ":"
              << epp->port();
  }
  LOG(INFO) << "kvserve-router ready http://" << f.host << ":" << front->port();
  if (const std::string file = absl::GetFlag(FLAGS_ports_file); !file.empty()) {
    RETURN_IF_ERROR(WriteFileAtomically(
        file, absl::StrCat("{\"port\": ", front->port(),
                           epp ? absl::StrCat(", \"epp_port\": ", epp->port()) : "",
                           ", \"pid\": ", getpid(), "}\n")));
  }
  WaitForStop();
  ShutDown(*front, epp.get(), metrics);
  core.reset();  // its jobs hold the front's connections
  return absl::OkStatus();
}

}  // namespace kvserve::router

int main(int argc, char** argv) {
  kvserve::InitProgram(
      argc, argv,
      "kvserve-router --model DIR (--workers HOST:PORT:EVENTS_PORT,... | --workers-dns "
      "NAME:PORT:EVENTS_PORT) [--port 8000]");
  PCHECK(pipe2(g_stop_pipe, O_CLOEXEC) == 0);
  PCHECK(fcntl(g_stop_pipe[1], F_SETFL, O_NONBLOCK) == 0);  // a signal never blocks on it
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGINT, OnSignal);
  absl::Status s = kvserve::router::Serve();
  if (!s.ok()) {
    std::cerr << "kvserve-router: " << s.message() << "\n";
    return 1;
  }
  return 0;
}
