#include "frontend/http/openai_handlers.h"

#include <algorithm>
#include <boost/asio/dispatch.hpp>
#include <chrono>
#include <cmath>
#include <functional>
#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "common/string_util.h"
#include "common/version.h"
#include "frontend/http/completion.h"
#include "frontend/http/stored_responses.h"
#include "frontend/output/messages_output.h"
#include "frontend/output/openai_error.h"
#include "frontend/output/openai_json.h"
#include "frontend/output/responses_output.h"
#include "frontend/request/messages_request.h"
#include "frontend/request/openai_request.h"
#include "frontend/request/prompt.h"
#include "frontend/request/responses_request.h"
#include "nlohmann/json.hpp"

namespace kvserve::frontend {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// When a request arriving now must have ended: the sooner of --request-timeout-seconds (zero:
// none) and the X-Request-Timeout header's seconds (empty: none). InvalidArgument naming the
// header for a value that is not a positive number of seconds.
absl::StatusOr<Clock::time_point> Deadline(absl::Duration server, const std::string& header) {
  absl::Duration timeout = server > absl::ZeroDuration() ? server : absl::InfiniteDuration();
  if (!header.empty()) {
    double seconds = 0;
    if (!absl::SimpleAtod(header, &seconds) || !(seconds > 0) || !std::isfinite(seconds)) {
      return absl::InvalidArgumentError(absl::StrCat("X-Request-Timeout: '", header.substr(0, 32),
                                                     "' is not a positive number of seconds"));
    }
    timeout = std::min(timeout, absl::Seconds(seconds));
  }
  if (timeout >= absl::Hours(24 * 365)) return Clock::time_point::max();  // none, in effect
  return Clock::now() + absl::ToChronoNanoseconds(timeout);
}

// Each prompt's ids (chat: the one), within the model's context with `max_tokens` more (chat
// without max_tokens: as many as fit, set here), and the prompts' tokens in all.
absl::StatusOr<std::vector<std::vector<int>>> TokenizePrompts(const FrontContext& ctx,
                                                              const ParsedRequest& r,
                                                              int* max_tokens,
                                                              int64_t* total_tokens) {
  const size_t count = r.chat ? 1 : r.prompts.size();
  std::vector<std::vector<int>> prompts;
  *total_tokens = 0;
  for (size_t k = 0; k < count; ++k) {
    ASSIGN_OR_RETURN(std::vector<int> ids,
                     PromptIds(*ctx.tokenizer, r, ctx.options.normalize_prompts, k));
    const int prompt_tokens = static_cast<int>(ids.size());
    const int limit = ctx.options.max_model_len;
    if (r.chat && !r.max_tokens_given) *max_tokens = limit - prompt_tokens;
    // int64: prompt_tokens + max_tokens overflows int for max_tokens near 2^31. Echo with
    // max_tokens 0 still runs one step.
    if (int64_t{prompt_tokens} + std::max(*max_tokens, 1) > limit ||
        *max_tokens < (r.echo && !r.chat ? 0 : 1)) {
      const std::string param =
          r.chat ? "messages" : (count > 1 ? absl::StrCat("prompt[", k, "]") : "prompt");
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: this model's maximum context length is %d tokens; the request has %d prompt "
          "tokens and asks for %d more",
          param, limit, prompt_tokens, *max_tokens));
    }
    *total_tokens += prompt_tokens;
    prompts.push_back(std::move(ids));
  }
  return prompts;
}

}  // namespace

namespace {

// Runs a parsed request: tokenizes and checks it, then hands it to a Completion (answering in
// `output`'s shape when it is set); `session` keys the routing's affinity; `rename` writes an
// error about the chat request as the client's API names its fields.
void Run(FrontContext& ctx, const std::shared_ptr<HttpConnection>& conn, const HttpRequest& request,
         ParsedRequest parsed, std::unique_ptr<ApiOutput> output, const std::string& session,
         const std::function<std::string(std::string_view)>& rename) {
  auto fail = [&](const absl::Status& s, std::string_view code = "") {
    const OpenAiError e =
        OpenAiErrorFromStatus(absl::Status(s.code(), rename(StdSv(s.message()))), code);
    conn->RespondError(output ? output->Error(e) : e);
  };
  if (parsed.tool_use.choice == ToolChoice::kAuto && !ctx.options.tool_parser) {
    return fail(absl::InvalidArgumentError(
        "tool_choice: \"auto\" (the default with tools) needs the router started with "
        "--enable-auto-tool-choice and --tool-call-parser; or send tool_choice \"required\", "
        "a named function or \"none\""));
  }
  if (parsed.model != ctx.options.served_model_name) {
    return fail(absl::NotFoundError(absl::StrCat("The model '", parsed.model, "' does not exist")),
                "model_not_found");
  }
  int max_tokens = parsed.max_tokens;
  int64_t prompt_tokens = 0;
  absl::StatusOr<std::vector<std::vector<int>>> prompts =
      TokenizePrompts(ctx, parsed, &max_tokens, &prompt_tokens);
  if (!prompts.ok()) {
    const bool too_long = absl::StrContains(prompts.status().message(), "maximum context length");
    return fail(prompts.status(), too_long ? "context_length_exceeded" : "");
  }
  if (absl::Status s = ResolveTokenParameters(*ctx.tokenizer, &parsed); !s.ok()) return fail(s);
  if (absl::Status s = CheckLogprobBudget(parsed, max_tokens, ctx.options.limits, prompt_tokens,
                                          ctx.tokenizer->vocab_size());
      !s.ok()) {
    return fail(s);
  }
  absl::StatusOr<Clock::time_point> deadline =
      Deadline(ctx.options.request_timeout, request.timeout);
  if (!deadline.ok()) return fail(deadline.status());
  auto completion = std::make_shared<Completion>(ctx, conn, std::move(parsed));
  completion->set_output(std::move(output));
  boost::asio::dispatch(completion->strand(),
                        [completion, prompts = *std::move(prompts), max_tokens, session,
                         at = *deadline, received = request.received] {
                          completion->Start(prompts, max_tokens, session, at, received);
                        });
}

std::string AsIs(std::string_view message) { return std::string(message); }

}  // namespace

void HandleCompletion(FrontContext& ctx, const std::shared_ptr<HttpConnection>& conn,
                      const HttpRequest& request, bool chat) {
  absl::StatusOr<ParsedRequest> parsed =
      ParseCompletionRequest(request.body, chat, ctx.options.limits);
  if (!parsed.ok()) return conn->RespondError(OpenAiErrorFromStatus(parsed.status()));
  Run(ctx, conn, request, *std::move(parsed), nullptr, request.session_id, AsIs);
}

void HandleResponses(FrontContext& ctx, const std::shared_ptr<HttpConnection>& conn,
                     const HttpRequest& request) {
  absl::StatusOr<ResponsesRequest> translated =
      TranslateResponsesRequest(request.body, ctx.options.limits, StateFor(ctx, request));
  if (!translated.ok()) return conn->RespondError(OpenAiErrorFromStatus(translated.status()));
  absl::StatusOr<ParsedRequest> parsed = ParseResponsesAsChat(*translated, ctx.options.limits);
  if (!parsed.ok()) return conn->RespondError(OpenAiErrorFromStatus(parsed.status()));
  auto output = std::make_unique<ResponsesOutput>(translated->echo, translated->output_logprobs);
  StoreWhenAnswered(ctx, request, *translated, *output);
  const std::string session =
      request.session_id.empty() ? translated->prompt_cache_key : request.session_id;
  Run(ctx, conn, request, *std::move(parsed), std::move(output), session,
      [r = *translated](std::string_view message) { return RenameResponsesParam(message, r); });
}

void HandleMessages(FrontContext& ctx, const std::shared_ptr<HttpConnection>& conn,
                    const HttpRequest& request) {
  auto fail = [&](const absl::Status& s) {
    conn->RespondError(AnthropicError(OpenAiErrorFromStatus(s)));
  };
  absl::StatusOr<MessagesRequest> translated =
      TranslateMessagesRequest(request.body, ctx.options.limits);
  if (!translated.ok()) return fail(translated.status());
  absl::StatusOr<ParsedRequest> parsed = ParseMessagesAsChat(*translated, ctx.options.limits);
  if (!parsed.ok()) return fail(parsed.status());
  Run(ctx, conn, request, *std::move(parsed), std::make_unique<MessagesOutput>(),
      request.session_id,
      [r = *translated](std::string_view message) { return RenameMessagesParam(message, r); });
}

void HandleCountTokens(const FrontContext& ctx, HttpConnection& conn, const HttpRequest& request) {
  auto fail = [&](const absl::Status& s) {
    conn.RespondError(AnthropicError(OpenAiErrorFromStatus(s)));
  };
  absl::StatusOr<MessagesRequest> translated =
      TranslateMessagesRequest(request.body, ctx.options.limits, /*counting=*/true);
  if (!translated.ok()) return fail(translated.status());
  absl::StatusOr<ParsedRequest> parsed = ParseMessagesAsChat(*translated, ctx.options.limits);
  if (!parsed.ok()) return fail(parsed.status());
  absl::StatusOr<std::vector<int>> ids =
      PromptIds(*ctx.tokenizer, *parsed, ctx.options.normalize_prompts, 0);
  if (!ids.ok()) {
    return fail(absl::Status(ids.status().code(),
                             RenameMessagesParam(StdSv(ids.status().message()), *translated)));
  }
  conn.Respond(200, JsonBody({{"input_tokens", ids->size()}}));
}

void HandleModels(const FrontContext& ctx, HttpConnection& conn) {
  conn.Respond(200, JsonBody({{"object", "list"},
                              {"data",
                               {{{"id", ctx.options.served_model_name},
                                 {"object", "model"},
                                 {"created", UnixSeconds()},
                                 {"owned_by", "kvserve"},
                                 {"root", ctx.options.model_root},
                                 {"parent", nullptr},
                                 {"max_model_len", ctx.options.max_model_len}}}}}));
}

void HandleVersion(HttpConnection& conn) {
  conn.Respond(200, JsonBody({{"version", std::string(kVersion)}}));
}

void HandleInvocations(FrontContext& ctx, const std::shared_ptr<HttpConnection>& conn,
                       const HttpRequest& request) {
  // Only the top-level keys matter here; the handler parses the body again, in full.
  const json body = json::parse(request.body, nullptr, false);
  if (body.is_object() && body.contains("messages")) {
    return HandleCompletion(ctx, conn, request, /*chat=*/true);
  }
  if (body.is_object() && body.contains("prompt")) {
    return HandleCompletion(ctx, conn, request, /*chat=*/false);
  }
  conn->RespondError(OpenAiErrorFromStatus(absl::InvalidArgumentError(
      "body: /invocations takes a chat completion request (with messages) or a completion "
      "request (with prompt)")));
}

}  // namespace kvserve::frontend
