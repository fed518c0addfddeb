#include "router/openai_handlers.h"

#include <algorithm>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <chrono>
#include <cmath>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/tokenizer/incremental_detokenizer.h"
#include "common/utf8.h"
#include "nlohmann/json.hpp"
#include "router/openai_request.h"
#include "router/prompt.h"
#include "router/stop_strings.h"

namespace kvserve::router {
namespace {

using json = nlohmann::json;
namespace pb = ::kvserve::v1;
using Clock = std::chrono::steady_clock;

int64_t UnixSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// A completions stream chunk's logprobs, in the legacy shape, from chat-style entries.
json CompletionLogprobs(const json& entries) {
  json out = {{"tokens", json::array()},
              {"token_logprobs", json::array()},
              {"top_logprobs", json::array()},
              {"text_offset", json::array()}};
  for (const json& e : entries) {
    out["tokens"].push_back(e["token"]);
    out["token_logprobs"].push_back(e["logprob"]);
    json top = json::object();
    for (const json& t : e["top_logprobs"]) top[t["token"].get<std::string>()] = t["logprob"];
    out["top_logprobs"].push_back(std::move(top));
  }
  return out;
}

json FinishReason(const std::string& finish) {
  return finish.empty() ? json(nullptr) : json(finish);
}

// One choice's decoding state.
struct Choice {
  std::unique_ptr<tokenizer::IncrementalDetokenizer> detok;
  std::unique_ptr<StopStringMatcher> stop;
  std::string text;
  int tokens = 0;
  bool done = false;
  bool role_sent = false;  // chat streams send the role in a choice's first chunk
  std::string finish;
  json logprobs = json::array();  // chat: content entries; completions: built at the end
  std::vector<std::string> lp_tokens;
  std::vector<float> lp_values;
  json lp_top = json::array();
};

// One completion request from its parsed body to its last byte. Owned by the job's response
// callback and the connection's gone callback; lives until both are dropped. Runs on a strand
// of the handler threads: one of its steps at a time, in order.
class Completion : public std::enable_shared_from_this<Completion> {
 public:
  Completion(FrontContext& ctx, std::shared_ptr<HttpConnection> conn, ParsedRequest req)
      : ctx_(ctx),
        conn_(std::move(conn)),
        req_(std::move(req)),
        strand_(boost::asio::make_strand(*ctx.handlers)) {}
  [[nodiscard]] const auto& strand() const { return strand_; }

  // Places the request; `session_header` is the X-Session-Id header; `deadline` when it must
  // have ended.
  void Start(const std::vector<int>& ids, int max_tokens, const std::string& session_header,
             Clock::time_point deadline, Clock::time_point received);

 private:
  std::shared_ptr<Job> MakeJob(const std::vector<int>& ids, int max_tokens);
  // `arrived`: when the reply reached the router's core.
  void OnResponse(const pb::GenerateResponse& r, Clock::time_point arrived);
  // Whether `r` ends the request with an error, which it then reports.
  bool HandleFailure(const pb::GenerateResponse& r);
  // Decodes `r`'s tokens into the choice; returns the text to send (stop strings held back).
  std::string Decode(Choice& c, const pb::GenerateResponse& r, json& lp_entries);
  void AddLogprobs(Choice& c, int id, const pb::PositionLogprobs& p, json& lp_entries);
  void SendChunk(int index, const std::string& text, const std::string& finish, const json& lp);
  void Finish(int cached);
  [[nodiscard]] json Usage(int cached) const;
  [[nodiscard]] json ChoiceLogprobs(const Choice& c) const;
  [[nodiscard]] json ChoicesJson() const;
  [[nodiscard]] bool AllDone() const;
  [[nodiscard]] std::string TokenText(int id) const {
    return Utf8Lossy(ctx_.tokenizer->TokenBytes(id));
  }

  FrontContext& ctx_;
  std::shared_ptr<HttpConnection> conn_;
  ParsedRequest req_;
  std::string request_id_;
  int64_t created_ = 0;
  int prompt_tokens_ = 0;
  int max_tokens_ = 0;  // per choice: a worker's tokens past it are not taken
  std::vector<Choice> choices_;
  Clock::time_point start_;
  bool first_token_seen_ = false;
  bool finished_ = false;
  // A stream's header goes out with its first response, so that a request refused before it
  // ran (the router's queue full, say) gets its own status, not an error inside a 200.
  bool stream_started_ = false;
  bool first_chunk_sent_ = false;
  boost::asio::strand<boost::asio::thread_pool::executor_type> strand_;
};

void Completion::Start(const std::vector<int>& ids, int max_tokens,
                       const std::string& session_header, Clock::time_point deadline,
                       Clock::time_point received) {
  prompt_tokens_ = static_cast<int>(ids.size());
  max_tokens_ = max_tokens;
  request_id_ = ctx_.NextRequestId(req_.chat);
  start_ = Clock::now();
  created_ = UnixSeconds();
  choices_.resize(req_.n);
  for (Choice& c : choices_) {
    c.detok = std::make_unique<tokenizer::IncrementalDetokenizer>(*ctx_.tokenizer,
                                                                  req_.skip_special_tokens);
    c.stop = std::make_unique<StopStringMatcher>(req_.stop);
  }
  std::shared_ptr<Job> job = MakeJob(ids, max_tokens);
  job->session_key = session_header.empty() ? req_.user : session_header;
  job->deadline = deadline;
  job->received = received;
  // The job keeps this completion alive until the core drops it (after the last response).
  std::shared_ptr<Completion> self = shared_from_this();
  job->on_response = [self](const pb::GenerateResponse& r) {
    boost::asio::post(self->strand_,
                      [self, r, arrived = Clock::now()] { self->OnResponse(r, arrived); });
  };
  // Weak: the connection must not keep its completion alive (the job does, until it ends).
  conn_->SetOnClientGone([weak = weak_from_this()] {  // stop the work on the worker
    const std::shared_ptr<Completion> self = weak.lock();
    if (self == nullptr) return;
    boost::asio::post(self->strand_, [self] {
      if (!self->finished_) self->ctx_.core->Abort(self->request_id_);
      self->finished_ = true;
    });
  });
  ctx_.core->Submit(std::move(job));
}

std::shared_ptr<Job> Completion::MakeJob(const std::vector<int>& ids, int max_tokens) {
  auto job = std::make_shared<Job>();
  pb::GenerateRequest& g = job->request;
  g.set_request_id(request_id_);
  for (int id : ids) g.add_prompt_token_ids(id);
  g.set_max_tokens(max_tokens);
  g.set_stream(true);
  g.set_cache_salt(req_.cache_salt);
  g.set_priority(req_.priority);
  for (int32_t t : req_.stop_token_ids) g.add_stop_token_ids(t);
  pb::SamplingParams* s = g.mutable_sampling();
  s->set_temperature(req_.temperature);
  s->set_top_p(req_.top_p);
  s->set_top_k(req_.top_k);
  s->set_min_p(req_.min_p);
  if (req_.seed) s->set_seed(*req_.seed);
  if (req_.logprobs) s->set_logprobs(*req_.logprobs);
  s->set_ignore_eos(req_.ignore_eos);
  s->set_n(req_.n);
  s->set_presence_penalty(req_.presence_penalty);
  s->set_frequency_penalty(req_.frequency_penalty);
  s->set_repetition_penalty(req_.repetition_penalty);
  s->set_min_tokens(req_.min_tokens);
  for (const auto& [id, bias] : req_.logit_bias) (*s->mutable_logit_bias())[id] = bias;
  for (const std::vector<int32_t>& word : req_.bad_word_ids) {
    s->add_bad_words()->mutable_ids()->Add(word.begin(), word.end());
  }
  for (int32_t id : req_.allowed_token_ids) s->add_allowed_token_ids(id);
  return job;
}

void Completion::OnResponse(const pb::GenerateResponse& r, Clock::time_point arrived) {
  if (finished_ || HandleFailure(r)) return;
  if (req_.stream && !stream_started_) {
    stream_started_ = true;
    conn_->StartEventStream();
  }
  const int index = r.sample_index();
  if (index < 0 || index >= static_cast<int>(choices_.size())) return;
  if (!first_token_seen_ && r.token_ids_size() > 0) {
    first_token_seen_ = true;
    ctx_.metrics->ObserveTtft(SecondsSince(start_));
  }
  Choice& c = choices_[index];
  if (!c.done) {
    json lp_entries = json::array();
    const std::string emitted = Decode(c, r, lp_entries);
    c.text += emitted;
    // A token whose text is held back (part of a UTF-8 character, or of what may be a stop
    // string) still sends its logprobs now, as vLLM does: none is left out of the stream.
    const bool logprobs_due = req_.logprobs && !lp_entries.empty();
    if (req_.stream && (!emitted.empty() || c.done || logprobs_due)) {
      json lp = nullptr;
      if (req_.logprobs)
        lp = req_.chat ? json{{"content", lp_entries}} : CompletionLogprobs(lp_entries);
      SendChunk(index, emitted, c.done ? c.finish : "", lp);
      if (!first_chunk_sent_) {
        first_chunk_sent_ = true;
        ctx_.metrics->ObserveAdded("to_client", SecondsSince(arrived));
      }
    }
  }
  // The worker's count of cached prompt tokens, within what the prompt can have.
  if (r.has_usage()) return Finish(std::clamp(r.usage().cached_prompt_tokens(), 0, prompt_tokens_));
  if (AllDone()) {  // every choice stopped on a stop string: the worker can stop too
    ctx_.core->Abort(request_id_);
    Finish(0);
  }
}

bool Completion::HandleFailure(const pb::GenerateResponse& r) {
  const bool failed = r.finish_reason() == pb::FINISH_REASON_ERROR ||
                      (r.finish_reason() == pb::FINISH_REASON_ABORT && !AllDone());
  if (!failed) return false;
  // A code outside absl's range (from a broken worker) reports as internal.
  const int code = r.error().code() >= 1 && r.error().code() <= 16
                       ? r.error().code()
                       : static_cast<int>(absl::StatusCode::kInternal);
  const OpenAiError e =
      OpenAiErrorFromStatus(absl::Status(static_cast<absl::StatusCode>(code), r.error().message()));
  finished_ = true;
  if (stream_started_) {
    conn_->CountStreamed(e.http_status);
    conn_->Write("data: " + e.json + "\n\n", false);
    conn_->Write("data: [DONE]\n\n", true);
  } else {
    conn_->RespondError(e);
  }
  return true;
}

std::string Completion::Decode(Choice& c, const pb::GenerateResponse& r, json& lp_entries) {
  std::string emitted;
  // A worker never sends more than max_tokens per choice; tokens past them are not kept.
  for (int i = 0; i < r.token_ids_size() && !c.done && c.tokens < max_tokens_; ++i) {
    const int id = r.token_ids(i);
    ++c.tokens;
    if (absl::StatusOr<std::string> piece = c.detok->Append(id); piece.ok()) {
      // Stop strings count from the min_tokens-th token on (vLLM's rule).
      StopStringMatcher::Result m = c.stop->Append(*piece, c.tokens >= req_.min_tokens);
      emitted += m.emit;
      if (m.stopped) {
        if (req_.include_stop_str_in_output) emitted += m.matched;
        c.done = true;
        c.finish = "stop";
      }
    }
    if (req_.logprobs && i < r.logprobs_size()) AddLogprobs(c, id, r.logprobs(i), lp_entries);
  }
  if (!c.done && r.finish_reason() != pb::FINISH_REASON_UNSPECIFIED) {
    emitted += c.stop->Append(c.detok->Finish()).emit;
    emitted += c.stop->Flush();
    c.done = true;
    c.finish = r.finish_reason() == pb::FINISH_REASON_LENGTH ? "length" : "stop";
  }
  return emitted;
}

void Completion::AddLogprobs(Choice& c, int id, const pb::PositionLogprobs& p, json& lp_entries) {
  json top = json::array();
  json top_map = json::object();
  // At most the alternatives asked for, whatever the worker sent.
  const int wanted = req_.logprobs.value_or(0);
  for (const pb::TokenLogprob& t : p.top()) {
    if (static_cast<int>(top.size()) >= wanted) break;
    top.push_back({{"token", TokenText(t.token_id())}, {"logprob", t.logprob()}});
    top_map[TokenText(t.token_id())] = t.logprob();
  }
  json entry = {
      {"token", TokenText(id)}, {"logprob", p.sampled().logprob()}, {"top_logprobs", top}};
  c.logprobs.push_back(entry);
  lp_entries.push_back(entry);
  c.lp_tokens.push_back(TokenText(id));
  c.lp_values.push_back(p.sampled().logprob());
  c.lp_top.push_back(top_map);
}

void Completion::SendChunk(int index, const std::string& text, const std::string& finish,
                           const json& lp) {
  json choice = {{"index", index}};
  if (req_.chat) {
    Choice& c = choices_[index];
    json delta = json::object();
    if (!c.role_sent) delta["role"] = "assistant", c.role_sent = true;
    if (!text.empty() || finish.empty()) delta["content"] = text;
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  choice["logprobs"] = lp;
  choice["finish_reason"] = FinishReason(finish);
  json chunk = {{"id", request_id_},
                {"object", req_.chat ? "chat.completion.chunk" : "text_completion"},
                {"created", created_},
                {"model", req_.model},
                {"choices", {choice}}};
  conn_->Write("data: " + JsonBody(chunk) + "\n\n", false);
}

void Completion::Finish(int cached) {
  if (finished_) return;
  finished_ = true;
  ctx_.metrics->ObserveE2e(SecondsSince(start_));
  if (!req_.stream) {
    return conn_->Respond(200,
                          JsonBody({{"id", request_id_},
                                    {"object", req_.chat ? "chat.completion" : "text_completion"},
                                    {"created", created_},
                                    {"model", req_.model},
                                    {"choices", ChoicesJson()},
                                    {"usage", Usage(cached)}}));
  }
  conn_->CountStreamed(200);
  if (req_.include_usage) {
    json chunk = {{"id", request_id_},
                  {"object", req_.chat ? "chat.completion.chunk" : "text_completion"},
                  {"created", created_},
                  {"model", req_.model},
                  {"choices", json::array()},
                  {"usage", Usage(cached)}};
    conn_->Write("data: " + JsonBody(chunk) + "\n\n", false);
  }
  conn_->Write("data: [DONE]\n\n", true);
}

json Completion::ChoicesJson() const {
  json choices = json::array();
  for (size_t i = 0; i < choices_.size(); ++i) {
    const Choice& c = choices_[i];
    json choice = {{"index", i}};
    if (req_.chat) {
      choice["message"] = {{"role", "assistant"}, {"content", c.text}};
    } else {
      choice["text"] = c.text;
    }
    choice["logprobs"] = ChoiceLogprobs(c);
    choice["finish_reason"] = c.finish;
    choices.push_back(std::move(choice));
  }
  return choices;
}

json Completion::Usage(int cached) const {
  int completion = 0;
  for (const Choice& c : choices_) completion += c.tokens;
  return {{"prompt_tokens", prompt_tokens_},
          {"completion_tokens", completion},
          {"total_tokens", prompt_tokens_ + completion},
          {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

json Completion::ChoiceLogprobs(const Choice& c) const {
  if (!req_.logprobs) return nullptr;
  if (req_.chat) return {{"content", c.logprobs}};
  return {{"tokens", c.lp_tokens},
          {"token_logprobs", c.lp_values},
          {"top_logprobs", c.lp_top},
          {"text_offset", json::array()}};
}

bool Completion::AllDone() const {
  for (const Choice& c : choices_) {
    if (!c.done) return false;
  }
  return true;
}

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

}  // namespace

void HandleCompletion(FrontContext& ctx, const std::shared_ptr<HttpConnection>& conn,
                      const HttpRequest& request, bool chat) {
  absl::StatusOr<ParsedRequest> parsed =
      ParseCompletionRequest(request.body, chat, ctx.options.limits);
  if (!parsed.ok()) return conn->RespondError(OpenAiErrorFromStatus(parsed.status()));
  if (parsed->model != ctx.options.served_model_name) {
    return conn->RespondError(OpenAiErrorFromStatus(
        absl::NotFoundError(absl::StrCat("The model '", parsed->model, "' does not exist")),
        "model_not_found"));
  }
  absl::StatusOr<std::vector<int>> ids =
      PromptIds(*ctx.tokenizer, *parsed, ctx.options.normalize_prompts);
  if (!ids.ok()) return conn->RespondError(OpenAiErrorFromStatus(ids.status()));
  if (absl::Status s = ResolveTokenParameters(*ctx.tokenizer, &*parsed); !s.ok()) {
    return conn->RespondError(OpenAiErrorFromStatus(s));
  }
  const int prompt_tokens = static_cast<int>(ids->size());
  const int limit = ctx.options.max_model_len;
  int max_tokens = parsed->max_tokens;
  if (chat && !parsed->max_tokens_given) max_tokens = limit - prompt_tokens;
  // int64: prompt_tokens + max_tokens overflows int for max_tokens near 2^31.
  if (int64_t{prompt_tokens} + max_tokens > limit || max_tokens < 1) {
    return conn->RespondError(OpenAiErrorFromStatus(
        absl::InvalidArgumentError(absl::StrFormat(
            "%s: this model's maximum context length is %d tokens; the request has %d prompt "
            "tokens and asks for %d more",
            chat ? "messages" : "prompt", limit, prompt_tokens, max_tokens)),
        "context_length_exceeded"));
  }
  if (absl::Status s = CheckLogprobBudget(*parsed, max_tokens, ctx.options.limits); !s.ok()) {
    return conn->RespondError(OpenAiErrorFromStatus(s));
  }
  absl::StatusOr<Clock::time_point> deadline =
      Deadline(ctx.options.request_timeout, request.timeout);
  if (!deadline.ok()) return conn->RespondError(OpenAiErrorFromStatus(deadline.status()));
  auto completion = std::make_shared<Completion>(ctx, conn, *std::move(parsed));
  boost::asio::dispatch(
      completion->strand(),
      [completion, ids = *std::move(ids), max_tokens, session = request.session_id, at = *deadline,
       received = request.received] { completion->Start(ids, max_tokens, session, at, received); });
}

void HandleModels(const FrontContext& ctx, HttpConnection& conn) {
  conn.Respond(200, JsonBody({{"object", "list"},
                              {"data",
                               {{{"id", ctx.options.served_model_name},
                                 {"object", "model"},
                                 {"created", UnixSeconds()},
                                 {"owned_by", "kvserve"},
                                 {"max_model_len", ctx.options.max_model_len}}}}}));
}

}  // namespace kvserve::router
