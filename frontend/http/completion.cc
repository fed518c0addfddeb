#include "frontend/http/completion.h"

#include <algorithm>
#include <boost/asio/post.hpp>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/utf8.h"
#include "frontend/output/openai_error.h"
#include "frontend/output/reasoning.h"
#include "proto/constraint_wire.h"

namespace kvserve::frontend {
namespace {

// Insertion-ordered, so that a completions position's top_logprobs names the chosen token
// first, as vLLM's (its test_return_tokens_as_token_ids reads each dict's first key).
using json = nlohmann::ordered_json;
namespace pb = ::kvserve::v1;
using Clock = Completion::Clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

void Completion::Start(std::vector<std::vector<int>> prompts, int max_tokens,
                       const std::string& session_header, Clock::time_point deadline,
                       Clock::time_point received) {
  max_tokens_ = max_tokens;
  if (req_.chat && ctx_.options.reasoning) StartReasoning(prompts[0]);
  request_id_ = ctx_.NextRequestId(req_.chat);
  response_id_ = req_.request_id.empty()
                     ? request_id_
                     : absl::StrCat(req_.chat ? "chatcmpl-" : "cmpl-", req_.request_id);
  start_ = Clock::now();
  created_ = UnixSeconds();
  if (output_)
    output_->Begin(response_id_.substr(response_id_.find('-') + 1), created_, req_.model);
  prompts_.resize(prompts.size());
  std::vector<std::string> tool_names;  // the calls a tool-call parser takes
  for (const ToolSpec& tool : req_.tool_use.tools) tool_names.push_back(tool.name);
  for (size_t k = 0; k < prompts.size(); ++k) {
    PromptJob& p = prompts_[k];
    p.ids = std::move(prompts[k]);
    p.job_id = prompts.size() == 1 ? request_id_ : absl::StrCat(request_id_, "-", k);
    if (req_.echo) p.echo = EchoText(k);
    for (int i = 0; i < req_.n(); ++i) {
      Choice& c = choices_.emplace_back();
      c.prompt = static_cast<int>(k);
      c.detok = std::make_unique<tokenizer::IncrementalDetokenizer>(*ctx_.tokenizer,
                                                                    req_.skip_special_tokens);
      BuildOutput(c, tool_names);
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

void Completion::BuildOutput(Choice& c, const std::vector<std::string>& tool_names) const {
  c.output.Add(StopStringStage(req_.stop, req_.include_stop_str_in_output));
  if (req_.chat && ctx_.options.reasoning) {
    c.output.Add(ReasoningStage(*ctx_.options.reasoning, reasoning_inside_));
    c.has_reasoning = true;
  }
  if (const std::optional<ToolOutput> format = ToolFormat()) {
    c.output.Add(ToolCallStage(*format, req_.tool_use.name, tool_names));
  }
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
  if (req_.chat) {  // vLLM's: the last message, when it has the role of the answer
    if (req_.messages.empty()) return {};
    const tokenizer::ChatMessage& last = req_.messages.back();
    const std::string_view role = req_.add_generation_prompt ? "assistant" : last.role;
    return last.role == role ? last.content : std::string();
  }
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
  g.mutable_prompt_token_ids()->Assign(p.ids.begin(), p.ids.end());  // one allocation
  g.set_max_tokens(std::max(max_tokens_, 1));  // echo with max_tokens 0: the one is not taken
  g.set_stream(true);
  g.set_cache_salt(req_.cache_salt);
  g.set_priority(req_.priority);
  for (int32_t t : req_.stop_token_ids) g.add_stop_token_ids(t);
  // The sampling parameters as parsed (the wire message is their one definition), and what
  // the job adds: the prompt logprobs the worker scores, the constraint.
  pb::SamplingParams* s = g.mutable_sampling();
  *s = req_.sampling;
  if (std::optional<int> top = req_.worker_prompt_logprobs()) s->set_prompt_logprobs(*top);
  if (req_.constraint) *s->mutable_constraint() = ConstraintToWire(*req_.constraint);
  return job;
}

void Completion::OnResponse(size_t prompt, const pb::GenerateResponse& r,
                            Clock::time_point arrived) {
  if (finished_ || prompts_[prompt].ended || HandleFailure(r)) return;
  if (req_.stream && !stream_started_) {
    stream_started_ = true;
    conn_->StartEventStream();
    if (output_) conn_->Write(output_->Opening(OutputUsage()), false);
  }
  PromptJob& p = prompts_[prompt];
  if (p.prompt_logprobs.empty() && r.prompt_logprobs_size() > 0) {
    p.prompt_logprobs.assign(r.prompt_logprobs().begin(), r.prompt_logprobs().end());
  }
  if (r.sample_index() < 0 || r.sample_index() >= req_.n()) return;
  const int index = static_cast<int>(prompt) * req_.n() + r.sample_index();
  if (!first_token_seen_ && r.token_ids_size() > 0) {
    first_token_seen_ = true;
    ctx_.metrics->ObserveTtft(SecondsSince(start_));
  }
  Choice& c = choices_[index];
  if (!c.done) {
    ChoiceDelta d;
    Echo(c, d);
    Decode(c, r, d);
    c.text += d.out.text;
    // A token whose text is held back (part of a UTF-8 character, or of what may be a stop
    // string) still sends its logprobs now, as vLLM does: none is left out of the stream.
    if (req_.stream &&
        (!d.echo.empty() || !d.out.text.empty() || !d.out.reasoning.empty() ||
         !d.out.calls.empty() || c.done || d.has_logprobs() || !d.token_ids.empty())) {
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
  if (stream_started_ && output_) {
    conn_->CountStreamed(e.http_status);
    conn_->Write(output_->Failed(e), true);
  } else if (stream_started_) {
    conn_->CountStreamed(e.http_status);
    conn_->Write("data: " + e.json + "\n\n", false);
    conn_->Write("data: [DONE]\n\n", true);
  } else {
    conn_->RespondError(output_ ? output_->Error(e) : e);
  }
  return true;
}

// The legacy API's (and vLLM's) top_logprobs of a position: the chosen token, then the `wanted`
// most likely (wanted or wanted + 1 entries, as the chosen one may be among them; 0 gives the
// chosen one alone). Keys are token texts: an alternative whose text is the chosen token's (or
// an earlier one's) does not replace it.
json Completion::LegacyTop(const std::string& token, const pb::PositionLogprobs& p,
                           int wanted) const {
  json top = json::object();
  top[token] = JsonLogprob(p.sampled());
  for (int k = 0; k < wanted && k < p.top_size(); ++k) {
    top.emplace(LogprobToken(p.top(k).token_id()), JsonLogprob(p.top(k)));
  }
  return top;
}

void Completion::Echo(Choice& c, ChoiceDelta& d) {
  if (c.echoed || !req_.echo) return;
  c.echoed = true;
  const PromptJob& p = prompts_[c.prompt];
  d.echo = p.echo;
  if (req_.chat || !req_.logprobs()) return;  // chat echoes text alone (vLLM's)
  // The prompt's tokens with their logprobs (the first has none), as vLLM echoes them.
  for (size_t i = 0; i < p.ids.size(); ++i) {
    const std::string token = LogprobToken(p.ids[i]);
    json logprob = nullptr, top = nullptr;
    if (i > 0 && i - 1 < p.prompt_logprobs.size()) {
      const pb::PositionLogprobs& lp = p.prompt_logprobs[i - 1];
      logprob = JsonLogprob(lp.sampled());
      top = LegacyTop(token, lp, *req_.logprobs());
    }
    d.legacy.Add(token, logprob, top, c.offset);
    c.legacy.Add(token, std::move(logprob), std::move(top), c.offset);
    c.offset += CodePoints(TokenText(p.ids[i]));
  }
}

void Completion::Decode(Choice& c, const pb::GenerateResponse& r, ChoiceDelta& d) {
  // A worker never sends more than max_tokens per choice; tokens past them are not kept.
  for (int i = 0; i < r.token_ids_size() && !c.done && c.tokens < max_tokens_; ++i) {
    const int id = r.token_ids(i);
    ++c.tokens;
    if (req_.return_token_ids) {
      c.token_ids.push_back(id);
      d.token_ids.push_back(id);
    }
    if (absl::StatusOr<std::string> piece = c.detok->Append(id); piece.ok()) {
      // Stop strings count from the min_tokens-th token on (vLLM's rule).
      c.output.Push(*std::move(piece), {.check_stops = c.tokens >= req_.sampling.min_tokens()},
                    d.out);
      if (d.out.stopped) {
        c.done = true;
        c.finish = "stop";
        c.stop_string = d.out.stop_string;
      }
    }
    if (req_.logprobs() && i < r.logprobs_size()) AddLogprobs(c, id, r.logprobs(i), d);
  }
  if (!c.done && r.finish_reason() != pb::FINISH_REASON_UNSPECIFIED) {
    c.output.Push(c.detok->Finish(), {.final = true}, d.out);
    c.done = true;
    c.finish = r.finish_reason() == pb::FINISH_REASON_LENGTH ? "length" : "stop";
  }
  c.reasoning_text += d.out.reasoning;
  c.calls.insert(c.calls.end(), d.out.calls.begin(), d.out.calls.end());
  // A choice that stopped after calling a tool ends with finish_reason tool_calls.
  if (c.done && !c.calls.empty() && c.finish == "stop") c.finish = "tool_calls";
}

void Completion::AddLogprobs(Choice& c, int id, const pb::PositionLogprobs& p, ChoiceDelta& d) {
  // At most the alternatives asked for (the top ones, or logprob_token_ids'), whatever the
  // worker sent.
  const int wanted = req_.alternatives();
  const std::string token = LogprobToken(id);
  if (req_.chat) {  // in the chat output's own JSON (the Responses and Messages outputs read it)
    nlohmann::json top = nlohmann::json::array();
    for (const pb::TokenLogprob& t : p.top()) {
      if (static_cast<int>(top.size()) >= wanted) break;
      top.push_back({{"token", LogprobToken(t.token_id())}, {"logprob", JsonLogprob(t)}});
    }
    nlohmann::json entry = {
        {"token", token}, {"logprob", JsonLogprob(p.sampled())}, {"top_logprobs", top}};
    c.logprobs.push_back(entry);
    d.chat_logprobs.push_back(std::move(entry));
    return;
  }
  json top = LegacyTop(token, p, wanted);
  d.legacy.Add(token, JsonLogprob(p.sampled()), top, c.offset);
  c.legacy.Add(token, JsonLogprob(p.sampled()), std::move(top), c.offset);
  c.offset += CodePoints(TokenText(id));
}

void Completion::SendChunk(int index, const ChoiceDelta& d, const std::string& finish) {
  if (output_) {  // one choice: n is 1
    return conn_->Write(output_->Delta(d.out.reasoning, d.out.text, d.chat_logprobs, d.out.calls),
                        false);
  }
  json choice = {{"index", index}};
  if (req_.chat) {
    Choice& c = choices_[index];
    json delta = json::object();
    if (!c.role_sent) delta["role"] = "assistant", c.role_sent = true;
    const OutputDelta& out = d.out;
    if (!out.reasoning.empty()) delta["reasoning_content"] = out.reasoning;
    if (!d.echo.empty() || !out.text.empty() ||
        (finish.empty() && out.reasoning.empty() && out.calls.empty())) {
      delta["content"] = d.echo + out.text;
    }
    if (!out.calls.empty()) {
      delta["tool_calls"] = ToolCallsJson(out.calls, c.calls.size() - out.calls.size());
    }
    choice["delta"] = delta;
    choice["logprobs"] = req_.logprobs() ? json{{"content", d.chat_logprobs}} : json(nullptr);
  } else {
    choice["text"] = d.echo + d.out.text;
    choice["logprobs"] = req_.logprobs() ? d.legacy.ToJson() : json(nullptr);
  }
  choice["finish_reason"] = FinishReasonJson(finish);
  Choice& sent = choices_[index];
  // Chat: in the stream's first chunk; completions: in each choice's first (its prompt's).
  const bool first =
      req_.return_token_ids && (req_.chat ? !first_chunk_sent_ : !sent.prompt_ids_sent);
  if (req_.return_token_ids) {  // vLLM's: the prompt's ids once, then each chunk's own
    sent.prompt_ids_sent = true;
    if (first && !req_.chat) choice["prompt_token_ids"] = prompts_[sent.prompt].ids;
    choice["token_ids"] = d.token_ids;
  }
  json chunk = {{"id", response_id_},
                {"object", req_.chat ? "chat.completion.chunk" : "text_completion"},
                {"created", created_},
                {"model", req_.model},
                {"choices", {choice}}};
  if (first && req_.chat) chunk["prompt_token_ids"] = prompts_[sent.prompt].ids;
  if (req_.continuous_usage) {  // this choice's so far, as vLLM counts it
    const int prompt = static_cast<int>(prompts_[choices_[index].prompt].ids.size());
    const int completion = choices_[index].tokens;
    chunk["usage"] = {{"prompt_tokens", prompt},
                      {"completion_tokens", completion},
                      {"total_tokens", prompt + completion}};
  }
  conn_->Write("data: " + OrderedJsonBody(chunk) + "\n\n", false);
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
  if (output_) return FinishOutput();
  if (!req_.stream) {
    json body = {
        {"id", response_id_},       {"object", req_.chat ? "chat.completion" : "text_completion"},
        {"created", created_},      {"model", req_.model},
        {"choices", ChoicesJson()}, {"usage", Usage()}};
    // vLLM's return_token_ids: chat's one prompt at the top, completions' per choice.
    if (req_.return_token_ids && req_.chat) body["prompt_token_ids"] = prompts_[0].ids;
    if (req_.prompt_logprobs && req_.chat) {  // vLLM's: chat's one prompt at the top too
      body["prompt_logprobs"] =
          PromptLogprobsJson(prompts_[0].prompt_logprobs, *req_.prompt_logprobs,
                             [this](int id) { return TokenText(id); });
    }
    return conn_->Respond(200, OrderedJsonBody(body));
  }
  conn_->CountStreamed(200);
  if (req_.include_usage) {
    json chunk = {{"id", response_id_},
                  {"object", req_.chat ? "chat.completion.chunk" : "text_completion"},
                  {"created", created_},
                  {"model", req_.model},
                  {"choices", json::array()},
                  {"usage", Usage()}};
    conn_->Write("data: " + OrderedJsonBody(chunk) + "\n\n", false);
  }
  conn_->Write("data: [DONE]\n\n", true);
}

ApiUsage Completion::OutputUsage() const {
  const Choice& c = choices_[0];
  ApiUsage usage;
  usage.input = static_cast<int>(prompts_[0].ids.size());
  usage.cached = prompts_[0].cached;
  usage.output = c.tokens;
  // The reasoning's tokens as the tokenizer reads its text back (within a token or two of
  // those drawn: the block's tags are not in it).
  if (!c.reasoning_text.empty()) {
    absl::StatusOr<std::vector<int>> ids = ctx_.tokenizer->Encode(c.reasoning_text, false);
    if (ids.ok()) usage.reasoning = std::min(static_cast<int>(ids->size()), c.tokens);
  }
  return usage;
}

void Completion::FinishOutput() {
  const Choice& c = choices_[0];
  const ApiFinish finish{c.finish, c.stop_string};
  if (!req_.stream) {
    output_->Delta(c.reasoning_text, c.text, c.logprobs, c.calls);
    return conn_->Respond(200, JsonBody(output_->Response(finish, OutputUsage())));
  }
  conn_->CountStreamed(200);
  conn_->Write(output_->Closing(finish, OutputUsage()), true);
}

json Completion::ChoicesJson() const {
  json choices = json::array();
  for (size_t i = 0; i < choices_.size(); ++i) {
    const Choice& c = choices_[i];
    const PromptJob& p = prompts_[c.prompt];
    json choice = {{"index", i}};
    if (req_.chat) {
      choice["message"] = {{"role", "assistant"}, {"content", p.echo + c.text}};
      if (!c.calls.empty()) {
        if (c.text.empty() && p.echo.empty()) choice["message"]["content"] = nullptr;
        choice["message"]["tool_calls"] = ToolCallsJson(c.calls, 0);
      }
      if (c.has_reasoning) {
        choice["message"]["reasoning_content"] =
            c.reasoning_text.empty() ? json(nullptr) : json(c.reasoning_text);
      }
    } else {
      choice["text"] = p.echo + c.text;
    }
    choice["logprobs"] = ChoiceLogprobs(c);
    choice["finish_reason"] = c.finish;
    if (req_.return_token_ids) {
      if (!req_.chat) choice["prompt_token_ids"] = p.ids;
      choice["token_ids"] = c.token_ids;
    }
    if (req_.prompt_logprobs && !req_.chat) {
      choice["prompt_logprobs"] = PromptLogprobsJson(p.prompt_logprobs, *req_.prompt_logprobs,
                                                     [this](int id) { return TokenText(id); });
    }
    choices.push_back(std::move(choice));
  }
  return choices;
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
  if (!req_.logprobs()) return nullptr;
  if (req_.chat) return {{"content", c.logprobs}};
  return c.legacy.ToJson();
}

bool Completion::PromptDone(size_t prompt) const {
  for (size_t i = prompt * req_.n(); i < (prompt + 1) * req_.n(); ++i) {
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

std::string Completion::TokenText(int id) const {
  return Utf8Lossy(ctx_.tokenizer->TokenBytes(id));
}

std::string Completion::LogprobToken(int id) const {
  return req_.return_tokens_as_token_ids ? absl::StrCat("token_id:", id) : TokenText(id);
}

}  // namespace kvserve::frontend
