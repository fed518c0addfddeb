#include "router/openai_handlers.h"

#include <algorithm>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <chrono>
#include <cmath>
#include <iterator>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "common/tokenizer/incremental_detokenizer.h"
#include "common/utf8.h"
#include "nlohmann/json.hpp"
#include "router/openai_request.h"
#include "router/prompt.h"
#include "router/reasoning.h"
#include "router/stop_strings.h"
#include "router/tool_calls.h"

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

// Characters of UTF-8 text, as Python's len() counts them (vLLM's text_offset unit).
int64_t CodePoints(std::string_view s) {
  int64_t n = 0;
  for (char ch : s) n += (static_cast<unsigned char>(ch) & 0xC0) != 0x80 ? 1 : 0;
  return n;
}

// Logprobs in the completions (legacy) shape: parallel lists.
struct LegacyLogprobs {
  json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(),
       text_offset = json::array();

  void Add(const std::string& token, json logprob, json top, int64_t offset) {
    tokens.push_back(token);
    token_logprobs.push_back(std::move(logprob));
    top_logprobs.push_back(std::move(top));
    text_offset.push_back(offset);
  }
  [[nodiscard]] bool empty() const { return tokens.empty(); }
  [[nodiscard]] json ToJson() const {
    return {{"tokens", tokens},
            {"token_logprobs", token_logprobs},
            {"top_logprobs", top_logprobs},
            {"text_offset", text_offset}};
  }
};

json FinishReason(const std::string& finish) {
  return finish.empty() ? json(nullptr) : json(finish);
}

// OpenAI's tool_calls entries, the first numbered `first` (streams number a choice's calls).
json ToolCallsJson(const std::vector<ParsedToolCall>& calls, size_t first) {
  json out = json::array();
  for (size_t k = 0; k < calls.size(); ++k) {
    out.push_back({{"index", first + k},
                   {"id", calls[k].id},
                   {"type", "function"},
                   {"function", {{"name", calls[k].name}, {"arguments", calls[k].arguments}}}});
  }
  return out;
}

// One prompt of the request (completions may send a list): its job on a worker.
struct PromptJob {
  std::vector<int> ids;
  std::string job_id;  // the request id the worker knows it by
  std::string echo;    // the text its choices start with, with echo
  bool ended = false;  // its last reply came, or it was aborted
  int cached = 0;
  std::vector<pb::PositionLogprobs> prompt_logprobs;  // from its first reply, when asked for
};

// One choice's decoding state.
struct Choice {
  int prompt = 0;  // its PromptJob
  std::unique_ptr<tokenizer::IncrementalDetokenizer> detok;
  std::unique_ptr<StopStringMatcher> stop;
  std::string text;  // generated (after the echo)
  int tokens = 0;
  bool done = false;
  bool echoed = false;     // its prompt's echo went out (stream) or was taken (whole)
  bool role_sent = false;  // chat streams send the role in a choice's first chunk
  std::string finish;
  std::unique_ptr<ReasoningSplitter> reasoning;  // chat with a reasoning parser
  std::string reasoning_text;
  std::unique_ptr<ToolCallSplitter> tools;  // chat whose output may hold tool calls
  std::vector<ParsedToolCall> calls;
  json logprobs = json::array();  // chat: content entries
  LegacyLogprobs legacy;          // completions
  int64_t offset = 0;             // completions: characters before the next logprobs token
};

// What one reply adds to a choice: text to send, logprobs entries in the endpoint's shape.
struct ChoiceDelta {
  std::string echo;  // the prompt's, in the choice's first delta
  std::string text;
  std::string reasoning;              // chat with a reasoning parser: reasoning_content
  std::vector<ParsedToolCall> calls;  // tool calls completed by this reply
  json chat_logprobs = json::array();
  LegacyLogprobs legacy;
  [[nodiscard]] bool has_logprobs() const { return !chat_logprobs.empty() || !legacy.empty(); }
};

// One completion request from its parsed body to its last byte. Owned by the jobs' response
// callbacks and the connection's gone callback; lives until all are dropped. Runs on a strand
// of the handler threads: one of its steps at a time, in order.
class Completion : public std::enable_shared_from_this<Completion> {
 public:
  Completion(FrontContext& ctx, std::shared_ptr<HttpConnection> conn, ParsedRequest req)
      : ctx_(ctx),
        conn_(std::move(conn)),
        req_(std::move(req)),
        strand_(boost::asio::make_strand(*ctx.handlers)) {}
  [[nodiscard]] const auto& strand() const { return strand_; }

  // Places a job per prompt (`prompts`: their ids); `session_header` is the X-Session-Id
  // header; `deadline` when it must have ended.
  void Start(std::vector<std::vector<int>> prompts, int max_tokens,
             const std::string& session_header, Clock::time_point deadline,
             Clock::time_point received);

 private:
  std::shared_ptr<Job> MakeJob(const PromptJob& p) const;
  [[nodiscard]] std::string EchoText(size_t prompt) const;
  // `arrived`: when the reply reached the router's core.
  void OnResponse(size_t prompt, const pb::GenerateResponse& r, Clock::time_point arrived);
  // Whether `r` ends the request with an error, which it then reports.
  bool HandleFailure(const pb::GenerateResponse& r);
  // The echo of the choice's prompt (text, and prompt logprobs with logprobs), once.
  void Echo(Choice& c, ChoiceDelta& d);
  // Decodes `r`'s tokens into the choice (stop strings held back).
  void Decode(Choice& c, const pb::GenerateResponse& r, ChoiceDelta& d);
  // Moves the reasoning block's text of d.text to d.reasoning.
  static void SplitReasoning(Choice& c, ChoiceDelta& d);
  // Moves the tool calls of d.text to d.calls; a choice that stopped after calling ends with
  // finish_reason tool_calls.
  static void SplitToolCalls(Choice& c, ChoiceDelta& d);
  // How the output carries tool calls; none for tool_choice none.
  [[nodiscard]] std::optional<ToolOutput> ToolFormat() const;
  // With a reasoning parser: whether the chat prompt opened the block, so the output starts
  // in it (then a constraint holds after the block).
  void StartReasoning(const std::vector<int>& prompt);
  void AddLogprobs(Choice& c, int id, const pb::PositionLogprobs& p, ChoiceDelta& d);
  void SendChunk(int index, const ChoiceDelta& d, const std::string& finish);
  // Ends the prompt's job (aborting it on its worker when it still runs) and, the last one,
  // the request.
  void EndPrompt(size_t prompt, bool abort);
  void AbortAll();
  void Finish();
  [[nodiscard]] json Usage() const;
  [[nodiscard]] json ChoiceLogprobs(const Choice& c) const;
  [[nodiscard]] json PromptLogprobs(const PromptJob& p) const;
  [[nodiscard]] json ChoicesJson() const;
  [[nodiscard]] bool PromptDone(size_t prompt) const;
  [[nodiscard]] bool AllChoicesDone() const;
  [[nodiscard]] std::string TokenText(int id) const {
    return Utf8Lossy(ctx_.tokenizer->TokenBytes(id));
  }

  FrontContext& ctx_;
  std::shared_ptr<HttpConnection> conn_;
  ParsedRequest req_;
  std::string request_id_;
  int64_t created_ = 0;
  int max_tokens_ = 0;  // per choice: a worker's tokens past it are not taken
  std::vector<PromptJob> prompts_;
  std::vector<Choice> choices_;  // prompt-major, then n (OpenAI's index)
  Clock::time_point start_;
  bool first_token_seen_ = false;
  bool finished_ = false;
  // A stream's header goes out with its first response, so that a request refused before it
  // ran (the router's queue full, say) gets its own status, not an error inside a 200.
  bool stream_started_ = false;
  bool first_chunk_sent_ = false;
  bool reasoning_inside_ = false;  // the chat prompt opened a reasoning block
  boost::asio::strand<boost::asio::thread_pool::executor_type> strand_;
};

void Completion::Start(std::vector<std::vector<int>> prompts, int max_tokens,
                       const std::string& session_header, Clock::time_point deadline,
                       Clock::time_point received) {
  max_tokens_ = max_tokens;
  if (req_.chat && ctx_.options.reasoning) StartReasoning(prompts[0]);
  request_id_ = ctx_.NextRequestId(req_.chat);
  start_ = Clock::now();
  created_ = UnixSeconds();
  prompts_.resize(prompts.size());
  std::vector<std::string> tool_names;  // the calls a tool-call parser takes
  for (const ToolSpec& tool : req_.tool_use.tools) tool_names.push_back(tool.name);
  for (size_t k = 0; k < prompts.size(); ++k) {
    PromptJob& p = prompts_[k];
    p.ids = std::move(prompts[k]);
    p.job_id = prompts.size() == 1 ? request_id_ : absl::StrCat(request_id_, "-", k);
    if (req_.echo) p.echo = EchoText(k);
    for (int i = 0; i < req_.n; ++i) {
      Choice& c = choices_.emplace_back();
      c.prompt = static_cast<int>(k);
      c.detok = std::make_unique<tokenizer::IncrementalDetokenizer>(*ctx_.tokenizer,
                                                                    req_.skip_special_tokens);
      c.stop = std::make_unique<StopStringMatcher>(req_.stop);
      if (req_.chat && ctx_.options.reasoning) {
        c.reasoning =
            std::make_unique<ReasoningSplitter>(*ctx_.options.reasoning, reasoning_inside_);
      }
      if (const std::optional<ToolOutput> format = ToolFormat()) {
        c.tools = std::make_unique<ToolCallSplitter>(*format, req_.tool_use.name, tool_names);
      }
    }
  }
  // Weak: the connection must not keep its completion alive (the jobs do, until they end).
  conn_->SetOnClientGone([weak = weak_from_this()] {  // stop the work on the workers
    const std::shared_ptr<Completion> self = weak.lock();
    if (self == nullptr) return;
    boost::asio::post(self->strand_, [self] {
      if (!self->finished_) self->AbortAll();
      self->finished_ = true;
    });
  });
  // Each job keeps this completion alive until the core drops it (after its last response).
  std::shared_ptr<Completion> self = shared_from_this();
  for (size_t k = 0; k < prompts_.size(); ++k) {
    std::shared_ptr<Job> job = MakeJob(prompts_[k]);
    job->session_key = session_header.empty() ? req_.user : session_header;
    job->deadline = deadline;
    job->received = received;
    job->on_response = [self, k](const pb::GenerateResponse& r) {
      boost::asio::post(self->strand_,
                        [self, k, r, arrived = Clock::now()] { self->OnResponse(k, r, arrived); });
    };
    ctx_.core->Submit(std::move(job));
  }
}

void Completion::StartReasoning(const std::vector<int>& prompt) {
  const ReasoningTags& tags = *ctx_.options.reasoning;
  const size_t tail = std::min<size_t>(prompt.size(), 16);
  const absl::StatusOr<std::string> text =
      ctx_.tokenizer->Decode(absl::MakeConstSpan(prompt).last(tail));
  reasoning_inside_ = text.ok() && PromptOpensReasoning(*text, tags);
  if (req_.constraint) req_.constraint->reasoning = {tags.start, tags.end, reasoning_inside_};
}

void Completion::SplitReasoning(Choice& c, ChoiceDelta& d) {
  ReasoningSplitter::Parts parts = c.reasoning->Append(d.text);
  if (c.done) {
    ReasoningSplitter::Parts rest = c.reasoning->Finish();
    parts.reasoning += rest.reasoning;
    parts.content += rest.content;
  }
  d.text = std::move(parts.content);
  d.reasoning = std::move(parts.reasoning);
  c.reasoning_text += d.reasoning;
}

void Completion::SplitToolCalls(Choice& c, ChoiceDelta& d) {
  ToolCallSplitter::Parts parts = c.tools->Append(d.text);
  if (c.done) {
    ToolCallSplitter::Parts rest = c.tools->Finish();
    parts.content += rest.content;
    std::move(rest.calls.begin(), rest.calls.end(), std::back_inserter(parts.calls));
  }
  d.text = std::move(parts.content);
  d.calls = std::move(parts.calls);
  c.calls.insert(c.calls.end(), d.calls.begin(), d.calls.end());
  if (c.done && !c.calls.empty() && c.finish == "stop") c.finish = "tool_calls";
}

std::optional<ToolOutput> Completion::ToolFormat() const {
  if (!req_.chat) return std::nullopt;
  switch (req_.tool_use.choice) {
    case ToolChoice::kNone:
      return std::nullopt;
    case ToolChoice::kAuto:
      return ctx_.options.tool_parser;
    case ToolChoice::kRequired:
      return ToolOutput::kRequiredArray;
    case ToolChoice::kNamed:
      return ToolOutput::kNamedArguments;
  }
  return std::nullopt;
}

std::string Completion::EchoText(size_t prompt) const {
  const PromptInput& in = req_.prompts[prompt];
  // A text prompt as sent (unless truncated); token ids as the tokenizer decodes them.
  if (in.text && !req_.truncate_prompt_tokens) return *in.text;
  absl::StatusOr<std::string> text =
      ctx_.tokenizer->Decode(prompts_[prompt].ids, req_.skip_special_tokens);
  return text.ok() ? Utf8Lossy(*text) : std::string();
}

std::shared_ptr<Job> Completion::MakeJob(const PromptJob& p) const {
  auto job = std::make_shared<Job>();
  pb::GenerateRequest& g = job->request;
  g.set_request_id(p.job_id);
  for (int id : p.ids) g.add_prompt_token_ids(id);
  g.set_max_tokens(std::max(max_tokens_, 1));  // echo with max_tokens 0: the one is not taken
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
  if (std::optional<int> top = req_.worker_prompt_logprobs()) s->set_prompt_logprobs(*top);
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
  if (const std::optional<structured::ConstraintSpec>& c = req_.constraint; c) {
    switch (c->kind) {
      case structured::ConstraintSpec::Kind::kRegex:
        s->mutable_constraint()->set_regex(c->regex);
        break;
      case structured::ConstraintSpec::Kind::kChoice:
        s->mutable_constraint()->mutable_choice()->mutable_choices()->Add(c->choices.begin(),
                                                                          c->choices.end());
        break;
      case structured::ConstraintSpec::Kind::kJsonSchema:
        s->mutable_constraint()->set_json_schema(c->json_schema);
        break;
      case structured::ConstraintSpec::Kind::kJsonObject:
        s->mutable_constraint()->set_json_object(true);
        break;
      case structured::ConstraintSpec::Kind::kGrammar:
        s->mutable_constraint()->set_grammar(c->grammar);
        break;
    }
    if (!c->reasoning.start.empty()) {
      pb::ReasoningBlock* block = s->mutable_constraint()->mutable_reasoning();
      block->set_start(c->reasoning.start);
      block->set_end(c->reasoning.end);
      block->set_inside(c->reasoning.inside);
    }
  }
  return job;
}

void Completion::OnResponse(size_t prompt, const pb::GenerateResponse& r,
                            Clock::time_point arrived) {
  if (finished_ || prompts_[prompt].ended || HandleFailure(r)) return;
  if (req_.stream && !stream_started_) {
    stream_started_ = true;
    conn_->StartEventStream();
  }
  PromptJob& p = prompts_[prompt];
  if (p.prompt_logprobs.empty() && r.prompt_logprobs_size() > 0) {
    p.prompt_logprobs.assign(r.prompt_logprobs().begin(), r.prompt_logprobs().end());
  }
  if (r.sample_index() < 0 || r.sample_index() >= req_.n) return;
  const int index = static_cast<int>(prompt) * req_.n + r.sample_index();
  if (!first_token_seen_ && r.token_ids_size() > 0) {
    first_token_seen_ = true;
    ctx_.metrics->ObserveTtft(SecondsSince(start_));
  }
  Choice& c = choices_[index];
  if (!c.done) {
    ChoiceDelta d;
    Echo(c, d);
    Decode(c, r, d);
    if (c.reasoning) SplitReasoning(c, d);
    if (c.tools) SplitToolCalls(c, d);
    c.text += d.text;
    // A token whose text is held back (part of a UTF-8 character, or of what may be a stop
    // string) still sends its logprobs now, as vLLM does: none is left out of the stream.
    if (req_.stream && (!d.echo.empty() || !d.text.empty() || !d.reasoning.empty() ||
                        !d.calls.empty() || c.done || d.has_logprobs())) {
      SendChunk(index, d, c.done ? c.finish : "");
      if (!first_chunk_sent_) {
        first_chunk_sent_ = true;
        ctx_.metrics->ObserveAdded("to_client", SecondsSince(arrived));
      }
    }
  }
  // The worker's count of cached prompt tokens, within what the prompt can have.
  if (r.has_usage()) {
    p.cached = std::clamp(r.usage().cached_prompt_tokens(), 0, static_cast<int>(p.ids.size()));
    return EndPrompt(prompt, /*abort=*/false);
  }
  // Every choice of the prompt stopped on a stop string: its worker can stop too.
  if (PromptDone(prompt)) EndPrompt(prompt, /*abort=*/true);
}
bool Completion::HandleFailure(const pb::GenerateResponse& r) {
  const bool failed = r.finish_reason() == pb::FINISH_REASON_ERROR ||
                      (r.finish_reason() == pb::FINISH_REASON_ABORT && !AllChoicesDone());
  if (!failed) return false;
  // A code outside absl's range (from a broken worker) reports as internal.
  const int code = r.error().code() >= 1 && r.error().code() <= 16
                       ? r.error().code()
                       : static_cast<int>(absl::StatusCode::kInternal);
  const OpenAiError e =
      OpenAiErrorFromStatus(absl::Status(static_cast<absl::StatusCode>(code), r.error().message()));
  AbortAll();  // the other prompts' jobs
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

void Completion::Echo(Choice& c, ChoiceDelta& d) {
  if (c.echoed || !req_.echo) return;
  c.echoed = true;
  const PromptJob& p = prompts_[c.prompt];
  d.echo = p.echo;
  if (!req_.logprobs) return;
  // The prompt's tokens with their logprobs (the first has none), as vLLM echoes them.
  for (size_t i = 0; i < p.ids.size(); ++i) {
    const std::string token = TokenText(p.ids[i]);
    json logprob = nullptr, top = nullptr;
    if (i > 0 && i - 1 < p.prompt_logprobs.size()) {
      const pb::PositionLogprobs& lp = p.prompt_logprobs[i - 1];
      logprob = lp.sampled().logprob();
      top = json::object();
      for (const pb::TokenLogprob& t : lp.top()) {
        if (static_cast<int>(top.size()) >= *req_.logprobs) break;
        top[TokenText(t.token_id())] = t.logprob();
      }
    }
    d.legacy.Add(token, logprob, top, c.offset);
    c.legacy.Add(token, std::move(logprob), std::move(top), c.offset);
    c.offset += CodePoints(token);
  }
}

void Completion::Decode(Choice& c, const pb::GenerateResponse& r, ChoiceDelta& d) {
  // A worker never sends more than max_tokens per choice; tokens past them are not kept.
  for (int i = 0; i < r.token_ids_size() && !c.done && c.tokens < max_tokens_; ++i) {
    const int id = r.token_ids(i);
    ++c.tokens;
    if (absl::StatusOr<std::string> piece = c.detok->Append(id); piece.ok()) {
      // Stop strings count from the min_tokens-th token on (vLLM's rule).
      StopStringMatcher::Result m = c.stop->Append(*piece, c.tokens >= req_.min_tokens);
      d.text += m.emit;
      if (m.stopped) {
        if (req_.include_stop_str_in_output) d.text += m.matched;
        c.done = true;
        c.finish = "stop";
      }
    }
    if (req_.logprobs && i < r.logprobs_size()) AddLogprobs(c, id, r.logprobs(i), d);
  }
  if (!c.done && r.finish_reason() != pb::FINISH_REASON_UNSPECIFIED) {
    d.text += c.stop->Append(c.detok->Finish()).emit;
    d.text += c.stop->Flush();
    c.done = true;
    c.finish = r.finish_reason() == pb::FINISH_REASON_LENGTH ? "length" : "stop";
  }
}

void Completion::AddLogprobs(Choice& c, int id, const pb::PositionLogprobs& p, ChoiceDelta& d) {
  // At most the alternatives asked for, whatever the worker sent.
  const int wanted = req_.logprobs.value_or(0);
  const std::string token = TokenText(id);
  if (req_.chat) {
    json top = json::array();
    for (const pb::TokenLogprob& t : p.top()) {
      if (static_cast<int>(top.size()) >= wanted) break;
      top.push_back({{"token", TokenText(t.token_id())}, {"logprob", t.logprob()}});
    }
    json entry = {{"token", token}, {"logprob", p.sampled().logprob()}, {"top_logprobs", top}};
    c.logprobs.push_back(entry);
    d.chat_logprobs.push_back(std::move(entry));
    return;
  }
  json top = json::object();
  for (const pb::TokenLogprob& t : p.top()) {
    if (static_cast<int>(top.size()) >= wanted) break;
    top[TokenText(t.token_id())] = t.logprob();
  }
  d.legacy.Add(token, p.sampled().logprob(), top, c.offset);
  c.legacy.Add(token, p.sampled().logprob(), std::move(top), c.offset);
  c.offset += CodePoints(token);
}

void Completion::SendChunk(int index, const ChoiceDelta& d, const std::string& finish) {
  json choice = {{"index", index}};
  if (req_.chat) {
    Choice& c = choices_[index];
    json delta = json::object();
    if (!c.role_sent) delta["role"] = "assistant", c.role_sent = true;
    if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
    if (!d.text.empty() || (finish.empty() && d.reasoning.empty() && d.calls.empty())) {
      delta["content"] = d.text;
    }
    if (!d.calls.empty())
      delta["tool_calls"] = ToolCallsJson(d.calls, c.calls.size() - d.calls.size());
    choice["delta"] = delta;
    choice["logprobs"] = req_.logprobs ? json{{"content", d.chat_logprobs}} : json(nullptr);
  } else {
    choice["text"] = d.echo + d.text;
    choice["logprobs"] = req_.logprobs ? d.legacy.ToJson() : json(nullptr);
  }
  choice["finish_reason"] = FinishReason(finish);
  json chunk = {{"id", request_id_},
                {"object", req_.chat ? "chat.completion.chunk" : "text_completion"},
                {"created", created_},
                {"model", req_.model},
                {"choices", {choice}}};
  conn_->Write("data: " + JsonBody(chunk) + "\n\n", false);
}

void Completion::EndPrompt(size_t prompt, bool abort) {
  PromptJob& p = prompts_[prompt];
  if (p.ended) return;
  p.ended = true;
  if (abort) ctx_.core->Abort(p.job_id);
  for (const PromptJob& other : prompts_) {
    if (!other.ended) return;
  }
  Finish();
}

void Completion::AbortAll() {
  for (PromptJob& p : prompts_) {
    if (!p.ended) ctx_.core->Abort(p.job_id);
    p.ended = true;
  }
}

void Completion::Finish() {
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
                                    {"usage", Usage()}}));
  }
  conn_->CountStreamed(200);
  if (req_.include_usage) {
    json chunk = {{"id", request_id_},
                  {"object", req_.chat ? "chat.completion.chunk" : "text_completion"},
                  {"created", created_},
                  {"model", req_.model},
                  {"choices", json::array()},
                  {"usage", Usage()}};
    conn_->Write("data: " + JsonBody(chunk) + "\n\n", false);
  }
  conn_->Write("data: [DONE]\n\n", true);
}

json Completion::ChoicesJson() const {
  json choices = json::array();
  for (size_t i = 0; i < choices_.size(); ++i) {
    const Choice& c = choices_[i];
    const PromptJob& p = prompts_[c.prompt];
    json choice = {{"index", i}};
    if (req_.chat) {
      choice["message"] = {{"role", "assistant"}, {"content", c.text}};
      if (!c.calls.empty()) {
        if (c.text.empty()) choice["message"]["content"] = nullptr;
        choice["message"]["tool_calls"] = ToolCallsJson(c.calls, 0);
      }
      if (c.reasoning) {
        choice["message"]["reasoning_content"] =
            c.reasoning_text.empty() ? json(nullptr) : json(c.reasoning_text);
      }
    } else {
      choice["text"] = p.echo + c.text;
    }
    choice["logprobs"] = ChoiceLogprobs(c);
    choice["finish_reason"] = c.finish;
    if (req_.prompt_logprobs) choice["prompt_logprobs"] = PromptLogprobs(p);
    choices.push_back(std::move(choice));
  }
  return choices;
}

// vLLM's shape: null for the first token, then per token {id: {logprob, rank, decoded_token}}
// holding the prompt token and the top alternatives.
json Completion::PromptLogprobs(const PromptJob& p) const {
  json out = json::array({nullptr});
  const int wanted = req_.prompt_logprobs.value_or(0);
  for (const pb::PositionLogprobs& lp : p.prompt_logprobs) {
    json position = json::object();
    int rank = 1;
    for (const pb::TokenLogprob& t : lp.top()) {
      if (rank > wanted) break;
      position[std::to_string(t.token_id())] = {
          {"logprob", t.logprob()}, {"rank", rank++}, {"decoded_token", TokenText(t.token_id())}};
    }
    position[std::to_string(lp.sampled().token_id())] = {
        {"logprob", lp.sampled().logprob()},
        {"rank", lp.rank()},
        {"decoded_token", TokenText(lp.sampled().token_id())}};
    out.push_back(std::move(position));
  }
  return out;
}

json Completion::Usage() const {
  int prompt = 0, completion = 0, cached = 0;
  for (const PromptJob& p : prompts_) {
    prompt += static_cast<int>(p.ids.size());
    cached += p.cached;
  }
  // Each choice's prompt counts once per prompt, as OpenAI and vLLM count it.
  for (const Choice& c : choices_) completion += c.tokens;
  return {{"prompt_tokens", prompt},
          {"completion_tokens", completion},
          {"total_tokens", prompt + completion},
          {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

json Completion::ChoiceLogprobs(const Choice& c) const {
  if (!req_.logprobs) return nullptr;
  if (req_.chat) return {{"content", c.logprobs}};
  return c.legacy.ToJson();
}

bool Completion::PromptDone(size_t prompt) const {
  for (size_t i = prompt * req_.n; i < (prompt + 1) * req_.n; ++i) {
    if (!choices_[i].done) return false;
  }
  return true;
}

bool Completion::AllChoicesDone() const {
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
        *max_tokens < (r.echo ? 0 : 1)) {
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

void HandleCompletion(FrontContext& ctx, const std::shared_ptr<HttpConnection>& conn,
                      const HttpRequest& request, bool chat) {
  absl::StatusOr<ParsedRequest> parsed =
      ParseCompletionRequest(request.body, chat, ctx.options.limits);
  if (!parsed.ok()) return conn->RespondError(OpenAiErrorFromStatus(parsed.status()));
  if (parsed->tool_use.choice == ToolChoice::kAuto && !ctx.options.tool_parser) {
    return conn->RespondError(OpenAiErrorFromStatus(absl::InvalidArgumentError(
        "tool_choice: \"auto\" (the default with tools) needs the router started with "
        "--enable-auto-tool-choice and --tool-call-parser; or send tool_choice \"required\", "
        "a named function or \"none\"")));
  }
  if (parsed->model != ctx.options.served_model_name) {
    return conn->RespondError(OpenAiErrorFromStatus(
        absl::NotFoundError(absl::StrCat("The model '", parsed->model, "' does not exist")),
        "model_not_found"));
  }
  int max_tokens = parsed->max_tokens;
  int64_t prompt_tokens = 0;
  absl::StatusOr<std::vector<std::vector<int>>> prompts =
      TokenizePrompts(ctx, *parsed, &max_tokens, &prompt_tokens);
  if (!prompts.ok()) {
    const bool too_long = absl::StrContains(prompts.status().message(), "maximum context length");
    return conn->RespondError(
        OpenAiErrorFromStatus(prompts.status(), too_long ? "context_length_exceeded" : ""));
  }
  if (absl::Status s = ResolveTokenParameters(*ctx.tokenizer, &*parsed); !s.ok()) {
    return conn->RespondError(OpenAiErrorFromStatus(s));
  }
  if (absl::Status s = CheckLogprobBudget(*parsed, max_tokens, ctx.options.limits, prompt_tokens);
      !s.ok()) {
    return conn->RespondError(OpenAiErrorFromStatus(s));
  }
  absl::StatusOr<Clock::time_point> deadline =
      Deadline(ctx.options.request_timeout, request.timeout);
  if (!deadline.ok()) return conn->RespondError(OpenAiErrorFromStatus(deadline.status()));
  auto completion = std::make_shared<Completion>(ctx, conn, *std::move(parsed));
  boost::asio::dispatch(completion->strand(), [completion, prompts = *std::move(prompts),
                                               max_tokens, session = request.session_id,
                                               at = *deadline, received = request.received] {
    completion->Start(prompts, max_tokens, session, at, received);
  });
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
