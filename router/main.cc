// kvserve-router: the HTTP front door. Tokenizes, hashes prompt blocks, routes each request to
// the worker that caches its prefix (or the least loaded), streams OpenAI-style responses.
//
//   kvserve-router --model DIR --workers 127.0.0.1:5570:5571,127.0.0.1:5580:5581 --port 8000
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/curve.h"
#include "common/file_util.h"
#include "common/hf_config.h"
#include "common/init.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "router/auth.h"
#include "router/http_front.h"
#include "router/reasoning.h"
#include "router/routing_flags.h"
#include "router/tool_calls.h"

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
ABSL_FLAG(double, heartbeat_timeout_seconds, 2.0, "A worker silent this long is out of rotation");
ABSL_FLAG(std::string, admin_token, "", "Bearer token for /admin/* (empty: admin API off)");
ABSL_FLAG(int32_t, max_unavailable, 1,
          "Recycle coordinator: most workers draining or recycling at once");
ABSL_FLAG(std::string, api_keys, "",
          "Comma-separated keys; when set, /v1/* needs Authorization: Bearer KEY");
ABSL_FLAG(std::string, api_keys_file, "",
          "A file of API keys (comma- or newline-separated, '#' comments), added to --api-keys; "
          "keeps them out of the process list");
ABSL_FLAG(std::string, admin_token_file, "",
          "A file holding the admin token, instead of --admin-token (empty file: admin API off)");
ABSL_FLAG(int32_t, max_stop_strings, 64, "Most stop strings in one request");
ABSL_FLAG(int32_t, max_stop_string_bytes, 1024, "Longest stop string, in bytes");
ABSL_FLAG(int32_t, max_stop_token_ids, 1024, "Most stop_token_ids in one request");
ABSL_FLAG(int32_t, max_messages, 4096, "Most chat messages in one request");
ABSL_FLAG(int32_t, max_prompts, 1024,
          "Most prompts in one /v1/completions request (a list of prompts); their text counts "
          "against --max-prompt-bytes in all");
ABSL_FLAG(int32_t, max_token_list_ids, 1 << 17,
          "Most logit_bias entries, and most allowed_token_ids, in one request (bad_words count "
          "against --max-stop-strings and --max-stop-string-bytes)");
ABSL_FLAG(int64_t, max_prompt_bytes, 0,
          "Most bytes of prompt text (all messages) before tokenization (0: 64 per token of "
          "--max-model-len, at least 1 MiB)");
ABSL_FLAG(int64_t, max_logprob_entries, 1 << 20,
          "Most prompts x n x max_tokens x (1 + top alternatives) of a request with logprobs, "
          "and prompt tokens x n x (1 + top alternatives) of one with prompt_logprobs or echo "
          "and logprobs");
ABSL_FLAG(std::string, curve_secret_key_file, "",
          "This router's CURVE secret key (kvserve-keygen): the links to workers are "
          "authenticated and encrypted; the workers must list its public key");
ABSL_FLAG(std::string, curve_server_key_file, "",
          "The workers' CURVE public key (or their secret-key file)");
ABSL_FLAG(double, shutdown_timeout_seconds, 30,
          "On SIGTERM the router takes no new connection and waits this long at most for those "
          "open to finish");
ABSL_FLAG(int32_t, api_threads, 2,
          "Threads for the HTTP handlers: parsing, tokenization, detokenization, stop strings "
          "(the sockets have a thread of their own)");
ABSL_FLAG(int32_t, max_connections, 4096,
          "HTTP connections open at once; past it a new one gets a 503 with Retry-After (the "
          "process's open-file limit is raised to its hard limit at start)");
ABSL_FLAG(double, client_read_timeout_seconds, 30,
          "A client must send its whole request within this long of connecting (else 408)");
ABSL_FLAG(double, client_write_timeout_seconds, 30,
          "A client that takes none of a response or stream chunk for this long is dropped and "
          "its request aborted");
ABSL_FLAG(int64_t, max_client_buffer_bytes, 4 << 20,
          "Most bytes of a stream waiting for a slow client; past it the client is dropped and "
          "its request aborted");
ABSL_FLAG(int32_t, client_send_buffer_bytes, 0,
          "SO_SNDBUF of client connections (0: the kernel's autotuning); smaller bounds the kernel "
          "memory a client that stops reading holds, and finds it sooner");
ABSL_FLAG(double, request_timeout_seconds, 600,
          "A generation request not finished this long after it arrived ends with a 504 and is "
          "aborted on its worker; clients may ask for less with X-Request-Timeout (0: no "
          "deadline but the client's)");
ABSL_FLAG(int32_t, max_inflight_per_worker, 0,
          "Sequences (a request of n samples is n) one worker takes from this router at once (0: "
          "the --max-num-seqs the worker reports); the rest wait in the router's queue");
ABSL_FLAG(int32_t, max_queued_requests, 1024,
          "Requests waiting at the router for a worker with room; past it, 429 with Retry-After");
ABSL_FLAG(double, max_queue_wait_seconds, 30,
          "A request that waited this long at the router for a worker with room gets a 429");
ABSL_FLAG(std::string, ports_file, "",
          "Write {\"port\": HTTP port, \"pid\": PID} as JSON here once listening");
ABSL_FLAG(std::string, reasoning_parser, "",
          "Chat outputs' reasoning block (<think>...</think>) goes to reasoning_content, and a "
          "structured-outputs constraint holds after it: qwen3 or deepseek_r1 (empty: off)");
ABSL_FLAG(std::string, tool_call_parser, "",
          "How chat outputs carry tool calls under tool_choice \"auto\": hermes (Qwen, Hermes: "
          "<tool_call> blocks) or llama3_json (Llama 3.1+ JSON); needs --enable-auto-tool-choice");
ABSL_FLAG(bool, enable_auto_tool_choice, false,
          "Serve tool_choice \"auto\" (the default when a request has tools), reading calls with "
          "--tool-call-parser; without it such requests get a 400, as in vLLM");
ABSL_FLAG(bool, return_tokens_as_token_ids, false,
          "Logprobs name tokens \"token_id:ID\" instead of their text, unless a request's "
          "return_tokens_as_token_ids says otherwise (vLLM's flag)");
ABSL_FLAG(bool, structured_outputs_any_whitespace, false,
          "JSON constraints (json_schema, json_object, forced tool calls) allow any whitespace "
          "between tokens (up to 20 bytes a gap, vLLM's default) instead of compact JSON with "
          "the separators \", \" and \": \"; a request's "
          "structured_outputs.disable_any_whitespace overrides it");
ABSL_FLAG(
    bool, normalize_prompts, false,
    "NFC-normalize prompts and trim trailing whitespace of system messages before tokenizing");

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

absl::StatusOr<RequestLimits> LimitsFromFlags(int max_model_len) {
  for (const auto& [flag, value] :
       {std::pair{"--max-stop-strings", int64_t{absl::GetFlag(FLAGS_max_stop_strings)}},
        {"--max-stop-string-bytes", absl::GetFlag(FLAGS_max_stop_string_bytes)},
        {"--max-stop-token-ids", absl::GetFlag(FLAGS_max_stop_token_ids)},
        {"--max-messages", absl::GetFlag(FLAGS_max_messages)},
        {"--max-prompts", absl::GetFlag(FLAGS_max_prompts)},
        {"--max-token-list-ids", absl::GetFlag(FLAGS_max_token_list_ids)},
        {"--max-logprob-entries", absl::GetFlag(FLAGS_max_logprob_entries)}}) {
    if (value < 1) return absl::InvalidArgumentError(absl::StrCat(flag, " must be at least 1"));
  }
  RequestLimits l;
  l.max_stop_strings = absl::GetFlag(FLAGS_max_stop_strings);
  l.max_stop_string_bytes = absl::GetFlag(FLAGS_max_stop_string_bytes);
  l.max_stop_token_ids = absl::GetFlag(FLAGS_max_stop_token_ids);
  l.max_messages = absl::GetFlag(FLAGS_max_messages);
  l.max_prompts = absl::GetFlag(FLAGS_max_prompts);
  l.max_token_list_ids = absl::GetFlag(FLAGS_max_token_list_ids);
  l.max_prompt_bytes = absl::GetFlag(FLAGS_max_prompt_bytes) > 0
                           ? absl::GetFlag(FLAGS_max_prompt_bytes)
                           : std::max<int64_t>(1 << 20, int64_t{64} * max_model_len);
  l.max_prompt_ids = max_model_len;
  l.max_logprob_entries = absl::GetFlag(FLAGS_max_logprob_entries);
  return l;
}

// --enable-auto-tool-choice needs --tool-call-parser (vLLM's rule); a parser alone does nothing.
absl::Status ToolParserFromFlags(FrontOptions* f) {
  const std::string parser = absl::GetFlag(FLAGS_tool_call_parser);
  std::optional<ToolOutput> format;
  if (!parser.empty()) {
    ASSIGN_OR_RETURN(format, ToolParserFor(parser));
  }
  if (!absl::GetFlag(FLAGS_enable_auto_tool_choice)) return absl::OkStatus();
  if (!format) {
    return absl::InvalidArgumentError("--enable-auto-tool-choice needs --tool-call-parser");
  }
  f->tool_parser = format;
  return absl::OkStatus();
}

// API keys and the admin token, from the flags and the files they name.
absl::Status SecretsFromFlags(FrontOptions* f) {
  for (absl::string_view k :
       absl::StrSplit(absl::GetFlag(FLAGS_api_keys), ',', absl::SkipEmpty())) {
    f->api_keys.emplace_back(k);
  }
  if (const std::string file = absl::GetFlag(FLAGS_api_keys_file); !file.empty()) {
    ASSIGN_OR_RETURN(std::string text, ReadFileToString(file));
    ASSIGN_OR_RETURN(std::vector<std::string> keys, ParseApiKeys(text, "--api-keys-file " + file));
    f->api_keys.insert(f->api_keys.end(), keys.begin(), keys.end());
  }
  f->admin_token = absl::GetFlag(FLAGS_admin_token);
  if (const std::string file = absl::GetFlag(FLAGS_admin_token_file); !file.empty()) {
    if (!f->admin_token.empty()) {
      return absl::InvalidArgumentError("--admin-token and --admin-token-file exclude each other");
    }
    ASSIGN_OR_RETURN(std::string text, ReadFileToString(file));
    f->admin_token = ParseToken(text);
  }
  return absl::OkStatus();
}

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

// Connection limits from the flags, checked against the process's open-file limit (raised to its
// hard limit: each connection is a descriptor).
absl::Status ConnectionsFromFlags(FrontOptions* f) {
  const double read_s = absl::GetFlag(FLAGS_client_read_timeout_seconds);
  const double write_s = absl::GetFlag(FLAGS_client_write_timeout_seconds);
  if (!(read_s > 0) || !(write_s > 0)) {
    return absl::InvalidArgumentError(
        "--client-read-timeout-seconds and --client-write-timeout-seconds must be > 0");
  }
  if (absl::GetFlag(FLAGS_max_connections) < 1 ||
      absl::GetFlag(FLAGS_max_client_buffer_bytes) < 1) {
    return absl::InvalidArgumentError(
        "--max-connections and --max-client-buffer-bytes must be at least 1");
  }
  f->connection.read_timeout = std::chrono::milliseconds(static_cast<int64_t>(read_s * 1000));
  f->connection.write_timeout = std::chrono::milliseconds(static_cast<int64_t>(write_s * 1000));
  f->connection.max_queued_bytes =
      static_cast<size_t>(absl::GetFlag(FLAGS_max_client_buffer_bytes));
  f->max_connections = absl::GetFlag(FLAGS_max_connections);
  f->api_threads = absl::GetFlag(FLAGS_api_threads);
  if (f->api_threads < 1 || f->api_threads > 256) {
    return absl::InvalidArgumentError("--api-threads must be in 1..256");
  }
  f->connection.send_buffer_bytes = std::max(0, absl::GetFlag(FLAGS_client_send_buffer_bytes));
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    setrlimit(RLIMIT_NOFILE, &files);
    getrlimit(RLIMIT_NOFILE, &files);
  }
  // Room for the listening socket, the links to workers, logs: 256 descriptors.
  const rlim_t spare = 256;
  if (files.rlim_cur != RLIM_INFINITY &&
      static_cast<rlim_t>(f->max_connections) + spare > files.rlim_cur) {
    const int fit = files.rlim_cur > spare ? static_cast<int>(files.rlim_cur - spare) : 1;
    LOG(WARNING) << "--max-connections " << f->max_connections << " lowered to " << fit
                 << ": the open-file limit is " << files.rlim_cur << " (ulimit -n)";
    f->max_connections = fit;
  }
  return absl::OkStatus();
}

// Admission and deadlines: the router's queue, per-worker limits, the request timeout.
absl::Status AdmissionFromFlags(RouterOptions* o, FrontOptions* f) {
  const double timeout = absl::GetFlag(FLAGS_request_timeout_seconds);
  const double wait = absl::GetFlag(FLAGS_max_queue_wait_seconds);
  if (!(timeout >= 0) || !(wait > 0)) {
    return absl::InvalidArgumentError(
        "--request-timeout-seconds must be >= 0 and --max-queue-wait-seconds > 0");
  }
  if (absl::GetFlag(FLAGS_max_inflight_per_worker) < 0 ||
      absl::GetFlag(FLAGS_max_queued_requests) < 0) {
    return absl::InvalidArgumentError(
        "--max-inflight-per-worker and --max-queued-requests must be >= 0");
  }
  f->request_timeout = absl::Seconds(timeout);
  o->max_inflight_per_worker = absl::GetFlag(FLAGS_max_inflight_per_worker);
  o->max_queued = absl::GetFlag(FLAGS_max_queued_requests);
  o->max_queue_wait = absl::Seconds(wait);
  return absl::OkStatus();
}

absl::Status Serve() {
  const std::string model = absl::GetFlag(FLAGS_model);
  if (model.empty()) return absl::InvalidArgumentError("--model DIR is required");
  ASSIGN_OR_RETURN(auto tok, tokenizer::Tokenizer::FromDirectory(model));
  ASSIGN_OR_RETURN(ModelConfig config, LoadHfConfig(model));
  RouterOptions o;
  ASSIGN_OR_RETURN(o.routing, RoutingConfigFromFlags());
  ASSIGN_OR_RETURN(o.curve, CurveFromFlags());
  o.heartbeat_timeout = absl::Seconds(absl::GetFlag(FLAGS_heartbeat_timeout_seconds));
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
    o.workers.push_back(e);
  }
  if (const std::string dns = absl::GetFlag(FLAGS_workers_dns); !dns.empty()) {
    ASSIGN_OR_RETURN(DnsTarget target, ParseDnsTarget(dns));
    o.workers_dns = target;
    if (!(absl::GetFlag(FLAGS_dns_refresh_seconds) > 0)) {
      return absl::InvalidArgumentError("--dns-refresh-seconds must be > 0");
    }
    o.dns_refresh = absl::Seconds(absl::GetFlag(FLAGS_dns_refresh_seconds));
  }
  if (o.workers.empty() && !o.workers_dns) {
    return absl::InvalidArgumentError("give the workers: --workers or --workers-dns");
  }
  FrontOptions f;
  f.host = absl::GetFlag(FLAGS_host);
  f.port = absl::GetFlag(FLAGS_port);
  f.served_model_name = absl::GetFlag(FLAGS_served_model_name);
  f.model_root = model;
  if (f.served_model_name.empty())
    f.served_model_name = std::filesystem::path(model).filename().string();
  RETURN_IF_ERROR(SecretsFromFlags(&f));
  RETURN_IF_ERROR(ConnectionsFromFlags(&f));
  RETURN_IF_ERROR(AdmissionFromFlags(&o, &f));
  f.normalize_prompts = absl::GetFlag(FLAGS_normalize_prompts);
  if (const std::string parser = absl::GetFlag(FLAGS_reasoning_parser); !parser.empty()) {
    ASSIGN_OR_RETURN(f.reasoning, ReasoningTagsFor(parser));
  }
  RETURN_IF_ERROR(ToolParserFromFlags(&f));
  o.max_unavailable = absl::GetFlag(FLAGS_max_unavailable);
  f.max_model_len = absl::GetFlag(FLAGS_max_model_len) > 0
                        ? absl::GetFlag(FLAGS_max_model_len)
                        : static_cast<int>(config.max_position_embeddings);
  ASSIGN_OR_RETURN(f.limits, LimitsFromFlags(f.max_model_len));
  f.limits.json_any_whitespace = absl::GetFlag(FLAGS_structured_outputs_any_whitespace);
  f.limits.tokens_as_token_ids = absl::GetFlag(FLAGS_return_tokens_as_token_ids);
  RouterMetrics metrics;
  o.metrics = &metrics;
  auto core = std::make_unique<RouterCore>(o);
  core->Start();
  ASSIGN_OR_RETURN(std::unique_ptr<HttpFront> front,
                   HttpFront::Start(f, tok.get(), core.get(), &metrics));
  LOG(INFO) << "kvserve-router ready http://" << f.host << ":" << front->port();
  if (const std::string file = absl::GetFlag(FLAGS_ports_file); !file.empty()) {
    RETURN_IF_ERROR(WriteFileAtomically(
        file, absl::StrCat("{\"port\": ", front->port(), ", \"pid\": ", getpid(), "}\n")));
  }
  WaitForStop();
  // SIGTERM: take no new connection, let those open finish (their streams end whole), then go.
  front->StopAccepting();
  const absl::Time give_up =
      absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_shutdown_timeout_seconds));
  while (metrics.open_connections() > 0 && absl::Now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (metrics.open_connections() > 0) {
    LOG(WARNING) << "kvserve-router: " << metrics.open_connections()
                 << " connections still open after --shutdown-timeout-seconds; closing them";
  }
  front->Stop();
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
