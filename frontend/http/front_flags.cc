// The OpenAI front's flags, shared by kvserve-router and kvserve-worker --openai-port: API keys
// and the admin token, request limits, client connections, admission and deadlines, the
// reasoning and tool-call parsers. Each binary keeps its own --host, --port, --model and
// --max-model-len.
#include "frontend/http/front_flags.h"

#include <sys/resource.h>

#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "frontend/http/auth.h"
#include "frontend/output/reasoning.h"
#include "frontend/output/tool_calls.h"
#include "glog/logging.h"

ABSL_FLAG(std::string, admin_token, "", "Bearer token for /admin/* (empty: admin API off)");
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
ABSL_FLAG(int32_t, max_logprobs, 20,
          "Most alternatives a generated or prompt position reports (top_logprobs, logprobs, "
          "prompt_logprobs), as vLLM's --max-logprobs; -1: no cap, so top_logprobs -1 (vLLM's "
          "whole vocabulary) is served");
ABSL_FLAG(int64_t, max_logprob_entries, 1 << 20,
          "Most prompts x n x max_tokens x (1 + top alternatives) of a request with logprobs, "
          "and prompt tokens x n x (1 + top alternatives) of one with prompt_logprobs or echo "
          "and logprobs");
ABSL_FLAG(int32_t, api_threads, 2,
          "Threads for the HTTP handlers: parsing, tokenization, detokenization, stop strings "
          "(the sockets have a thread of their own). 0: generation requests' handlers run on the "
          "sockets' thread, and kvserve-router's routing core with them: the least CPU per "
          "request, but a long text prompt's tokenization holds up every other stream (the "
          "other endpoints get one thread)");
ABSL_FLAG(int32_t, max_connections, 4096,
          "HTTP connections open at once; past it a new one gets a 503 with Retry-After (the "
          "process's open-file limit is raised to its hard limit at start)");
ABSL_FLAG(double, client_read_timeout_seconds, 30,
          "A client must send its whole request within this long of connecting (else 408)");
ABSL_FLAG(double, keep_alive_timeout_seconds, 75,
          "HTTP/1.1 keep-alive: how long a connection may wait idle for its next request (0: "
          "every response closes its connection). Keep it above the idle timeout of the load "
          "balancer's pooled connections (nginx and AWS ALB: 60 s)");
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
    std::string, responses_store, "memory",
    "Where the Responses API keeps stored responses (store, previous_response_id, GET and "
    "DELETE /v1/responses/{id}): memory (in this process), redis://[:PASSWORD@]HOST:PORT[/DB] "
    "(Redis or Valkey, shared by router replicas), or none");
ABSL_FLAG(double, responses_store_ttl_seconds, 86400, "How long a stored response is kept");
ABSL_FLAG(int64_t, responses_store_max_mb, 256,
          "--responses-store memory: the most it holds; past it the oldest responses go");
ABSL_FLAG(
    bool, normalize_prompts, false,
    "NFC-normalize prompts and trim trailing whitespace of system messages before tokenizing");

namespace kvserve::frontend {
namespace {

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
  if (absl::GetFlag(FLAGS_max_logprobs) < -1) {
    return absl::InvalidArgumentError("--max-logprobs must be -1 (no cap) or at least 0");
  }
  RequestLimits l;
  l.max_logprobs = absl::GetFlag(FLAGS_max_logprobs);
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
  const double keep_alive_s = absl::GetFlag(FLAGS_keep_alive_timeout_seconds);
  if (!(keep_alive_s >= 0) || keep_alive_s > 86400) {
    return absl::InvalidArgumentError("--keep-alive-timeout-seconds must be in 0..86400");
  }
  f->connection.keep_alive_timeout =
      std::chrono::milliseconds(static_cast<int64_t>(keep_alive_s * 1000));
  f->connection.max_queued_bytes =
      static_cast<size_t>(absl::GetFlag(FLAGS_max_client_buffer_bytes));
  f->max_connections = absl::GetFlag(FLAGS_max_connections);
  f->api_threads = absl::GetFlag(FLAGS_api_threads);
  if (f->api_threads < 0 || f->api_threads > 256) {
    return absl::InvalidArgumentError("--api-threads must be in 0..256");
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
absl::Status AdmissionFromFlags(Admission* a, FrontOptions* f) {
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
  a->max_inflight_per_worker = absl::GetFlag(FLAGS_max_inflight_per_worker);
  a->max_queued = absl::GetFlag(FLAGS_max_queued_requests);
  a->max_queue_wait = absl::Seconds(wait);
  return absl::OkStatus();
}

}  // namespace

absl::Status FrontFromFlags(int max_model_len, FrontOptions* f, Admission* a) {
  f->max_model_len = max_model_len;
  RETURN_IF_ERROR(SecretsFromFlags(f));
  RETURN_IF_ERROR(ConnectionsFromFlags(f));
  RETURN_IF_ERROR(AdmissionFromFlags(a, f));
  f->normalize_prompts = absl::GetFlag(FLAGS_normalize_prompts);
  if (const std::string parser = absl::GetFlag(FLAGS_reasoning_parser); !parser.empty()) {
    ASSIGN_OR_RETURN(f->reasoning, ReasoningTagsFor(parser));
  }
  RETURN_IF_ERROR(ToolParserFromFlags(f));
  ASSIGN_OR_RETURN(f->limits, LimitsFromFlags(max_model_len));
  f->limits.json_any_whitespace = absl::GetFlag(FLAGS_structured_outputs_any_whitespace);
  f->limits.tokens_as_token_ids = absl::GetFlag(FLAGS_return_tokens_as_token_ids);
  f->responses_store.url = absl::GetFlag(FLAGS_responses_store);
  const double ttl = absl::GetFlag(FLAGS_responses_store_ttl_seconds);
  if (!(ttl > 0 && ttl <= 365 * 86400)) {
    return absl::InvalidArgumentError("--responses-store-ttl-seconds must be in (0, 31536000]");
  }
  f->responses_store.ttl = absl::Seconds(ttl);
  const int64_t mb = absl::GetFlag(FLAGS_responses_store_max_mb);
  if (mb <= 0 || mb > (int64_t{1} << 20)) {
    return absl::InvalidArgumentError("--responses-store-max-mb must be in [1, 1048576]");
  }
  f->responses_store.max_bytes = mb << 20;
  // A bad store name stops the process now, not at its first stored response.
  RETURN_IF_ERROR(MakeResponseStore(f->responses_store).status());
  if (f->api_threads == 0 && f->responses_store.url.rfind("redis", 0) == 0) {
    return absl::InvalidArgumentError(
        "--api-threads 0 runs the handlers on the sockets' thread, where a --responses-store "
        "round trip would hold up every stream: give --api-threads 1 or more");
  }
  return absl::OkStatus();
}

}  // namespace kvserve::frontend
