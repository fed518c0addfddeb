#include "frontend/http/admin_handlers.h"

#include "absl/strings/str_cat.h"
#include "frontend/http/auth.h"
#include "frontend/request/openai_request.h"
#include "frontend/request/prompt.h"
#include "nlohmann/json.hpp"

namespace kvserve::frontend {
namespace {

using json = nlohmann::json;
namespace pb = ::kvserve::v1;

void RespondStatus(HttpConnection& conn, const absl::Status& s) {
  conn.RespondError(OpenAiErrorFromStatus(s));
}

json WorkerJson(const WorkerInfo& w) {
  return {{"name", w.name},
          {"eligible", w.eligible},
          {"state", w.state},
          {"load", w.load},
          {"instance_id", std::to_string(w.instance_id)},
          {"num_running", w.num_running},
          {"num_waiting", w.num_waiting},
          {"device_blocks",
           {{"total", w.device_blocks_total},
            {"active", w.device_blocks_active},
            {"cached_evictable", w.device_blocks_cached}}},
          {"router",
           {{"load_blocks", w.load_blocks},
            {"prefill_tokens", w.prefill_tokens},
            {"decode_seqs", w.decode_seqs},
            {"load_reported", w.load_reported},
            {"inflight_requests", w.inflight_requests},
            {"inflight_limit", w.inflight_limit},
            {"index_blocks", w.index_blocks},
            {"kv_event_batches", w.event_batches},
            {"kv_event_gaps", w.event_gaps},
            {"kv_event_joins", w.event_joins},
            {"kv_snapshots", w.snapshots}}}};
}

// POST /admin/workers/NAME/(drain|undrain|recycle).
void ControlWorker(FrontContext& ctx, HttpConnection& conn, const std::string& path) {
  const std::string prefix = "/admin/workers/";
  const size_t slash = path.rfind('/');
  const std::string name = path.substr(prefix.size(), slash - prefix.size());
  const std::string verb = path.substr(slash + 1);
  const pb::ControlAction action = verb == "drain"     ? pb::CONTROL_ACTION_DRAIN
                                   : verb == "undrain" ? pb::CONTROL_ACTION_UNDRAIN
                                   : verb == "recycle" ? pb::CONTROL_ACTION_RECYCLE
                                                       : pb::CONTROL_ACTION_UNSPECIFIED;
  if (action == pb::CONTROL_ACTION_UNSPECIFIED) {
    return RespondStatus(conn, absl::InvalidArgumentError(absl::StrCat(
                                   "action: '", verb, "' is not drain, undrain or recycle")));
  }
  if (absl::Status s = ctx.core->Control(name, action); !s.ok()) return RespondStatus(conn, s);
  conn.Respond(200, JsonBody({{"ok", true}, {"worker", name}, {"action", verb}}));
}

}  // namespace

void HandleAdmin(FrontContext& ctx, HttpConnection& conn, const HttpRequest& request) {
  if (absl::Status s = CheckAdminToken(ctx.options.admin_token, request.authorization); !s.ok()) {
    const int status = absl::IsNotFound(s) ? 404 : 401;
    return conn.RespondError(
        MakeOpenAiError(status, "authentication_error", std::string(s.message())));
  }
  const std::string& path = request.path;
  if (request.method == "GET" && path == "/admin/workers") {
    json list = json::array();
    for (const WorkerInfo& w : ctx.core->Workers()) list.push_back(WorkerJson(w));
    return conn.Respond(200, JsonBody({{"workers", list}, {"recycle_grants", ctx.core->grants()}}));
  }
  const std::string prefix = "/admin/workers/";
  if (request.method == "POST" && path.rfind(prefix, 0) == 0 && path.rfind('/') > prefix.size()) {
    return ControlWorker(ctx, conn, path);
  }
  conn.RespondError(MakeOpenAiError(404, "not_found", "unknown admin route"));
}

void HandleTokenize(const FrontContext& ctx, HttpConnection& conn, const HttpRequest& request) {
  json j = json::parse(request.body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return RespondStatus(conn, absl::InvalidArgumentError("body: is not a JSON object"));
  }
  ParsedRequest r;
  r.chat = j.contains("messages");
  if (r.chat) {
    j["model"] = ctx.options.served_model_name;
    absl::StatusOr<ParsedRequest> p = ParseCompletionRequest(j.dump(), true, ctx.options.limits);
    if (!p.ok()) return RespondStatus(conn, p.status());
    r = *std::move(p);
  } else if (j.contains("prompt") && j["prompt"].is_string()) {
    r.prompts.push_back({j["prompt"].get<std::string>(), {}});
    const std::string& text = *r.prompts.back().text;
    if (static_cast<int64_t>(text.size()) > ctx.options.limits.max_prompt_bytes) {
      return RespondStatus(
          conn, absl::InvalidArgumentError(
                    absl::StrCat("prompt: has ", text.size(), " bytes of text; the limit is ",
                                 ctx.options.limits.max_prompt_bytes, " (--max-prompt-bytes)")));
    }
    if (j.contains("add_special_tokens")) {
      if (!j["add_special_tokens"].is_boolean()) {
        return RespondStatus(conn,
                             absl::InvalidArgumentError("add_special_tokens: must be a boolean"));
      }
      r.add_special_tokens = j["add_special_tokens"].get<bool>();
    }
  } else {
    return RespondStatus(
        conn, absl::InvalidArgumentError("prompt: give 'prompt' (a string) or 'messages'"));
  }
  // vLLM's return_token_strs: each id as the tokenizer's file writes it.
  const bool strs = j.contains("return_token_strs") && !j["return_token_strs"].is_null();
  if (strs && !j["return_token_strs"].is_boolean()) {
    return RespondStatus(conn,
                         absl::InvalidArgumentError("return_token_strs: must be true or false"));
  }
  absl::StatusOr<std::vector<int>> ids =
      PromptIds(*ctx.tokenizer, r, ctx.options.normalize_prompts);
  if (!ids.ok()) return RespondStatus(conn, ids.status());
  // token_strs is null when not asked for, as vLLM's TokenizeResponse has it.
  json body = {{"tokens", *ids},
               {"count", ids->size()},
               {"max_model_len", ctx.options.max_model_len},
               {"token_strs", nullptr}};
  if (strs && j["return_token_strs"].get<bool>()) {
    json token_strs = json::array();
    for (int id : *ids) token_strs.push_back(ctx.tokenizer->IdToToken(id));
    body["token_strs"] = std::move(token_strs);
  }
  conn.Respond(200, JsonBody(body));
}

void HandleDetokenize(const FrontContext& ctx, HttpConnection& conn, const HttpRequest& request) {
  const absl::Status bad = absl::InvalidArgumentError(
      "tokens: must be a list of token ids (non-negative 32-bit integers)");
  json j = json::parse(request.body, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("tokens") || !j["tokens"].is_array()) {
    return RespondStatus(conn, bad);
  }
  std::vector<int> ids;
  for (const json& v : j["tokens"]) {
    // Whole, non-negative and 32-bit: 4294967301 is refused, not wrapped to 5.
    if (!v.is_number_unsigned() || v.get<uint64_t>() > INT32_MAX) return RespondStatus(conn, bad);
    ids.push_back(static_cast<int>(v.get<uint64_t>()));
  }
  absl::StatusOr<std::string> text = ctx.tokenizer->Decode(ids);
  if (!text.ok()) {
    return RespondStatus(
        conn, absl::InvalidArgumentError(absl::StrCat("tokens: ", text.status().message())));
  }
  conn.Respond(200, JsonBody({{"prompt", *text}}));
}

}  // namespace kvserve::frontend
