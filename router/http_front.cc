#include "router/http_front.h"

#include <array>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <deque>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/tokenizer/chat_template.h"
#include "common/tokenizer/incremental_detokenizer.h"
#include "common/utf8.h"
#include "glog/logging.h"
#include "nlohmann/json.hpp"
#include "router/openai_request.h"
#include "router/stop_strings.h"

namespace kvserve::router {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using json = nlohmann::json;
namespace pb = ::kvserve::v1;

struct HttpFront::Impl {
  FrontOptions options;
  const tokenizer::Tokenizer* tok;
  RouterCore* core;
  RouterMetrics* metrics;
  asio::io_context io;
  tcp::acceptor acceptor{io};
  std::atomic<uint64_t> next_id{1};
  std::string id_prefix;

  void Accept();
};

namespace {

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

int64_t Now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string TokenText(const tokenizer::Tokenizer& tok, int id) {
  return Utf8Lossy(tok.TokenBytes(id));
}

// One choice's decoding state.
struct Choice {
  std::unique_ptr<tokenizer::IncrementalDetokenizer> detok;
  std::unique_ptr<StopStringMatcher> stop;
  std::string text;
  int tokens = 0;
  bool done = false;
  std::string finish;
  json logprobs = json::array();  // chat: content entries; completions: built at the end
  std::vector<std::string> lp_tokens;
  std::vector<float> lp_values;
  json lp_top = json::array();
};

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, HttpFront::Impl* front) : socket_(std::move(socket)), front_(front) {}

  void Start() {
    parser_.emplace();
    parser_->body_limit(front_->options.max_body_bytes);
    http::async_read(
        socket_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->OnRead(ec); });
  }

 private:
  void OnRead(beast::error_code ec) {
    if (ec == http::error::body_limit) {
      Respond(413, Dump({{"error",
                          {{"message", "request body too large"},
                           {"type", "invalid_request_error"},
                           {"param", nullptr},
                           {"code", nullptr}}}}));
      return;
    }
    if (ec) return;
    const auto& req = parser_->get();
    const std::string target(req.target());
    const std::string method(req.method_string());
    if (!front_->options.api_keys.empty() && target.rfind("/v1/", 0) == 0) {
      const std::string auth(req[http::field::authorization]);
      bool ok = false;
      for (const std::string& key : front_->options.api_keys) ok = ok || auth == "Bearer " + key;
      if (!ok) {
        endpoint_ = target.substr(0, target.find('?'));
        return Respond(
            401, Dump({{"error",
                        {{"message", "a valid API key is required (Authorization: Bearer ...)"},
                         {"type", "authentication_error"},
                         {"param", nullptr},
                         {"code", "invalid_api_key"}}}}));
      }
    }
    // Session affinity: the X-Session-Id header, else the request's `user`.
    session_header_ = std::string(req["x-session-id"]);
    endpoint_ = target.substr(0, target.find('?'));
    if (method == "GET" && target == "/health") return Respond(200, "ok\n", "text/plain");
    if (method == "GET" && target == "/metrics") {
      return Respond(200, front_->metrics->Serialize(), "text/plain; version=0.0.4; charset=utf-8");
    }
    if (method == "GET" && target == "/ready") {
      const std::string counts = absl::StrCat(front_->core->eligible_workers(), "/",
                                              front_->core->known_workers(), " workers\n");
      return front_->core->ready() ? Respond(200, "ready: " + counts, "text/plain")
                                   : Respond(503, "no worker is ready: " + counts, "text/plain");
    }
    if (method == "GET" && target == "/v1/models") {
      return Respond(200, Dump({{"object", "list"},
                                {"data",
                                 {{{"id", front_->options.served_model_name},
                                   {"object", "model"},
                                   {"created", Now()},
                                   {"owned_by", "kvserve"},
                                   {"max_model_len", front_->options.max_model_len}}}}}));
    }
    if (method == "POST" && (target == "/v1/completions" || target == "/v1/chat/completions")) {
      return Generate(req.body(), target == "/v1/chat/completions");
    }
    if (target.rfind("/admin/", 0) == 0)
      return Admin(method, target, std::string(req[http::field::authorization]));
    if (method == "POST" && target == "/tokenize") return Tokenize(req.body());
    if (method == "POST" && target == "/detokenize") return Detokenize(req.body());
    Respond(404, Dump({{"error",
                        {{"message", absl::StrCat("no route for ", method, " ", target)},
                         {"type", "not_found"},
                         {"param", nullptr},
                         {"code", nullptr}}}}));
  }

  void Error(const absl::Status& s, std::string_view code = "") {
    OpenAiError e = OpenAiErrorFromStatus(s, code);
    Respond(e.http_status, e.json);
  }

  void Respond(int status, std::string body, std::string content_type = "application/json") {
    front_->metrics->CountRequest(KnownEndpoint(), status);
    auto res = std::make_shared<http::response<http::string_body>>();
    res->result(static_cast<http::status>(status));
    res->version(11);
    res->set(http::field::content_type, content_type);
    if (status == 429 || status == 503) res->set(http::field::retry_after, "1");
    res->keep_alive(false);
    res->body() = std::move(body);
    res->prepare_payload();
    http::async_write(socket_, *res, [self = shared_from_this(), res](beast::error_code, size_t) {
      // Lingering close: stop sending, then read and drop what the client still sends (an
      // oversized body, say) so that it sees our response instead of a connection reset.
      beast::error_code ignored;
      self->socket_.shutdown(tcp::socket::shutdown_send, ignored);
      auto timer = std::make_shared<asio::steady_timer>(self->socket_.get_executor(),
                                                        std::chrono::seconds(5));
      timer->async_wait([self, timer](beast::error_code) {
        beast::error_code ec;
        self->socket_.close(ec);  // a client that neither finishes nor closes
      });
      self->Drain(std::make_shared<std::array<char, 65536>>(), 0);
    });
  }

  void Drain(std::shared_ptr<std::array<char, 65536>> buf, size_t total) {
    if (total > (64u << 20)) return;
    socket_.async_read_some(asio::buffer(*buf), [self = shared_from_this(), buf, total](
                                                    beast::error_code ec, size_t n) {
      if (!ec) self->Drain(buf, total + n);
    });
  }

  // Streaming: raw writes, queued so that async writes never overlap.
  void Write(std::string data, bool last) {
    writes_.push_back(std::move(data));
    close_after_ = close_after_ || last;
    if (writes_.size() == 1) WriteNext();
  }

  void WriteNext() {
    asio::async_write(socket_, asio::buffer(writes_.front()),
                      [self = shared_from_this()](beast::error_code ec, size_t) {
                        if (ec) {  // the client went away: stop the work on the worker
                          if (!self->finished_) self->front_->core->Abort(self->request_id_);
                          self->finished_ = true;
                          self->writes_.clear();
                          return;
                        }
                        self->writes_.pop_front();
                        if (!self->writes_.empty()) return self->WriteNext();
                        if (self->close_after_) {
                          beast::error_code ignored;
                          self->socket_.shutdown(tcp::socket::shutdown_both, ignored);
                        }
                      });
  }

  absl::StatusOr<std::vector<int>> PromptIds(ParsedRequest r) {
    const tokenizer::Tokenizer& tok = *front_->tok;
    std::vector<int> ids;
    if (front_->options.normalize_prompts) {
      for (tokenizer::ChatMessage& m : r.messages) {
        m.content = Utf8Nfc(m.content);
        if (m.role == "system") {
          while (!m.content.empty() && std::isspace(static_cast<unsigned char>(m.content.back())))
            m.content.pop_back();
        }
      }
      if (r.prompt_text) r.prompt_text = Utf8Nfc(*r.prompt_text);
    }
    if (r.chat) {
      absl::StatusOr<tokenizer::ChatTemplate> tmpl =
          tokenizer::ChatTemplate::Detect(tok.chat_template(), tok.bos_token());
      if (!tmpl.ok()) return tmpl.status();
      tokenizer::ChatRenderOptions opts;
      opts.add_generation_prompt = r.add_generation_prompt;
      opts.enable_thinking = r.enable_thinking;
      absl::StatusOr<std::string> text = tmpl->Render(r.messages, opts);
      if (!text.ok())
        return absl::InvalidArgumentError(absl::StrCat("messages: ", text.status().message()));
      absl::StatusOr<std::vector<int>> enc = tok.Encode(*text, false);
      if (!enc.ok()) return enc.status();
      ids = *enc;
    } else if (r.prompt_text) {
      absl::StatusOr<std::vector<int>> enc = tok.Encode(*r.prompt_text, r.add_special_tokens);
      if (!enc.ok()) return enc.status();
      ids = *enc;
    } else {
      ids.assign(r.prompt_ids.begin(), r.prompt_ids.end());
      for (int id : ids) {
        if (!tok.IsValidId(id))
          return absl::InvalidArgumentError(
              absl::StrCat("prompt: token id ", id, " is not in the vocabulary"));
      }
    }
    if (r.truncate_prompt_tokens && static_cast<int>(ids.size()) > *r.truncate_prompt_tokens) {
      ids.erase(ids.begin(), ids.end() - *r.truncate_prompt_tokens);
    }
    if (ids.empty()) return absl::InvalidArgumentError("prompt: must not be empty");
    return ids;
  }

  void Generate(const std::string& body, bool chat) {
    absl::StatusOr<ParsedRequest> parsed = ParseCompletionRequest(body, chat);
    if (!parsed.ok()) return Error(parsed.status());
    req_ = *std::move(parsed);
    if (req_.model != front_->options.served_model_name) {
      return Error(absl::NotFoundError(absl::StrCat("The model '", req_.model, "' does not exist")),
                   "model_not_found");
    }
    absl::StatusOr<std::vector<int>> ids = PromptIds(req_);
    if (!ids.ok()) return Error(ids.status());
    prompt_tokens_ = static_cast<int>(ids->size());
    const int limit = front_->options.max_model_len;
    int max_tokens = req_.max_tokens;
    if (chat && !req_.max_tokens_given) max_tokens = limit - prompt_tokens_;
    if (prompt_tokens_ + max_tokens > limit || max_tokens < 1) {
      return Error(absl::InvalidArgumentError(absl::StrFormat(
                       "%s: this model's maximum context length is %d "
                       "tokens; the request has %d prompt "
                       "tokens and asks for %d more",
                       chat ? "messages" : "prompt", limit, prompt_tokens_, max_tokens)),
                   "context_length_exceeded");
    }
    request_id_ = absl::StrCat(chat ? "chatcmpl-" : "cmpl-", front_->id_prefix, front_->next_id++);
    start_ = std::chrono::steady_clock::now();
    created_ = Now();
    choices_.resize(req_.n);
    for (Choice& c : choices_) {
      c.detok = std::make_unique<tokenizer::IncrementalDetokenizer>(*front_->tok,
                                                                    req_.skip_special_tokens);
      c.stop = std::make_unique<StopStringMatcher>(req_.stop);
    }
    auto job = std::make_shared<Job>();
    pb::GenerateRequest& g = job->request;
    g.set_request_id(request_id_);
    for (int id : *ids) g.add_prompt_token_ids(id);
    g.set_max_tokens(max_tokens);
    g.set_stream(true);
    g.set_cache_salt(req_.cache_salt);
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
    job->session_key = session_header_.empty() ? req_.user : session_header_;
    // The job keeps the session alive until the core drops it (after the last response).
    std::shared_ptr<Session> self = shared_from_this();
    asio::io_context* io = &front_->io;
    job->on_response = [self, io](const pb::GenerateResponse& r) {
      asio::post(*io, [self, r] { self->OnResponse(r); });
    };
    if (req_.stream) {
      Write(
          "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
          "Connection: close\r\nX-Accel-Buffering: no\r\n\r\n",
          false);
    }
    front_->core->Submit(std::move(job));
  }

  json Usage(int cached) const {
    int completion = 0;
    for (const Choice& c : choices_) completion += c.tokens;
    return {{"prompt_tokens", prompt_tokens_},
            {"completion_tokens", completion},
            {"total_tokens", prompt_tokens_ + completion},
            {"prompt_tokens_details", {{"cached_tokens", cached}}}};
  }

  json ChoiceLogprobs(const Choice& c, bool chat) const {
    if (!req_.logprobs) return nullptr;
    if (chat) return {{"content", c.logprobs}};
    json top = c.lp_top;
    return {{"tokens", c.lp_tokens},
            {"token_logprobs", c.lp_values},
            {"top_logprobs", top},
            {"text_offset", json::array()}};
  }

  void SendChunk(int index, const std::string& text, const std::string& finish, const json& lp) {
    json choice;
    if (req_.chat) {
      json delta = json::object();
      if (!role_sent_[index]) delta["role"] = "assistant", role_sent_[index] = true;
      if (!text.empty() || finish.empty()) delta["content"] = text;
      choice = {{"index", index},
                {"delta", delta},
                {"logprobs", lp},
                {"finish_reason", finish.empty() ? json(nullptr) : json(finish)}};
    } else {
      choice = {{"index", index},
                {"text", text},
                {"logprobs", lp},
                {"finish_reason", finish.empty() ? json(nullptr) : json(finish)}};
    }
    json chunk = {{"id", request_id_},
                  {"object", req_.chat ? "chat.completion.chunk" : "text_completion"},
                  {"created", created_},
                  {"model", req_.model},
                  {"choices", {choice}}};
    Write("data: " + Dump(chunk) + "\n\n", false);
  }

  void Finish(int cached) {
    if (finished_) return;
    finished_ = true;
    front_->metrics->ObserveE2e(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
    if (req_.stream) front_->metrics->CountRequest(KnownEndpoint(), 200);
    if (req_.stream) {
      if (req_.include_usage) {
        json chunk = {{"id", request_id_},
                      {"object", req_.chat ? "chat.completion.chunk" : "text_completion"},
                      {"created", created_},
                      {"model", req_.model},
                      {"choices", json::array()},
                      {"usage", Usage(cached)}};
        Write("data: " + Dump(chunk) + "\n\n", false);
      }
      Write("data: [DONE]\n\n", true);
      return;
    }
    json choices = json::array();
    for (size_t i = 0; i < choices_.size(); ++i) {
      const Choice& c = choices_[i];
      if (req_.chat) {
        choices.push_back({{"index", i},
                           {"message", {{"role", "assistant"}, {"content", c.text}}},
                           {"logprobs", ChoiceLogprobs(c, true)},
                           {"finish_reason", c.finish}});
      } else {
        choices.push_back({{"index", i},
                           {"text", c.text},
                           {"logprobs", ChoiceLogprobs(c, false)},
                           {"finish_reason", c.finish}});
      }
    }
    Respond(200, Dump({{"id", request_id_},
                       {"object", req_.chat ? "chat.completion" : "text_completion"},
                       {"created", created_},
                       {"model", req_.model},
                       {"choices", choices},
                       {"usage", Usage(cached)}}));
  }

  void OnResponse(const pb::GenerateResponse& r) {
    if (finished_) return;
    if (r.finish_reason() == pb::FINISH_REASON_ERROR ||
        (r.finish_reason() == pb::FINISH_REASON_ABORT && !AllDone())) {
      absl::Status s(static_cast<absl::StatusCode>(r.error().code() == 0 ? 13 : r.error().code()),
                     r.error().message());
      if (req_.stream) {
        OpenAiError e = OpenAiErrorFromStatus(s);
        Write("data: " + e.json + "\n\n", false);
        finished_ = true;
        Write("data: [DONE]\n\n", true);
      } else {
        finished_ = true;
        Error(s);
      }
      return;
    }
    const int index = r.sample_index();
    if (index < 0 || index >= static_cast<int>(choices_.size())) return;
    if (!first_token_seen_ && r.token_ids_size() > 0) {
      first_token_seen_ = true;
      front_->metrics->ObserveTtft(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
    }
    Choice& c = choices_[index];
    if (!c.done) {
      std::string emitted;
      json lp_entries = json::array();
      for (int i = 0; i < r.token_ids_size() && !c.done; ++i) {
        const int id = r.token_ids(i);
        ++c.tokens;
        absl::StatusOr<std::string> piece = c.detok->Append(id);
        if (piece.ok()) {
          StopStringMatcher::Result m = c.stop->Append(*piece);
          emitted += m.emit;
          if (m.stopped) {
            if (req_.include_stop_str_in_output) emitted += m.matched;
            c.done = true;
            c.finish = "stop";
          }
        }
        if (req_.logprobs && i < r.logprobs_size()) {
          const pb::PositionLogprobs& p = r.logprobs(i);
          json top = json::array();
          json top_map = json::object();
          for (const pb::TokenLogprob& t : p.top()) {
            top.push_back(
                {{"token", TokenText(*front_->tok, t.token_id())}, {"logprob", t.logprob()}});
            top_map[TokenText(*front_->tok, t.token_id())] = t.logprob();
          }
          json entry = {{"token", TokenText(*front_->tok, id)},
                        {"logprob", p.sampled().logprob()},
                        {"top_logprobs", top}};
          c.logprobs.push_back(entry);
          lp_entries.push_back(entry);
          c.lp_tokens.push_back(TokenText(*front_->tok, id));
          c.lp_values.push_back(p.sampled().logprob());
          c.lp_top.push_back(top_map);
        }
      }
      if (!c.done && r.finish_reason() != pb::FINISH_REASON_UNSPECIFIED) {
        emitted += c.stop->Append(c.detok->Finish()).emit;
        emitted += c.stop->Flush();
        c.done = true;
        c.finish = r.finish_reason() == pb::FINISH_REASON_LENGTH ? "length" : "stop";
      }
      c.text += emitted;
      if (req_.stream && (!emitted.empty() || c.done)) {
        json lp = nullptr;
        if (req_.logprobs)
          lp = req_.chat ? json{{"content", lp_entries}} : json{{"tokens", json::array()}};
        SendChunk(index, emitted, c.done ? c.finish : "", lp);
      }
    }
    if (r.has_usage()) return Finish(r.usage().cached_prompt_tokens());
    if (AllDone()) {  // every choice stopped on a stop string: the worker can stop too
      front_->core->Abort(request_id_);
      Finish(0);
    }
  }

  bool AllDone() const {
    for (const Choice& c : choices_) {
      if (!c.done) return false;
    }
    return true;
  }

  void Admin(const std::string& method, const std::string& target, const std::string& auth) {
    const std::string& token = front_->options.admin_token;
    if (token.empty() || auth != "Bearer " + token) {
      return Respond(token.empty() ? 404 : 401,
                     Dump({{"error",
                            {{"message", token.empty() ? "the admin API is off (--admin-token)"
                                                       : "admin token required"},
                             {"type", "authentication_error"},
                             {"param", nullptr},
                             {"code", nullptr}}}}));
    }
    if (method == "GET" && target == "/admin/workers") {
      json list = json::array();
      for (const WorkerInfo& w : front_->core->Workers()) {
        list.push_back({{"name", w.name},
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
                          {"index_blocks", w.index_blocks},
                          {"kv_event_batches", w.event_batches},
                          {"kv_event_gaps", w.event_gaps},
                          {"kv_snapshots", w.snapshots}}}});
      }
      return Respond(200, Dump({{"workers", list}, {"recycle_grants", front_->core->grants()}}));
    }
    // POST /admin/workers/NAME/(drain|undrain|recycle)
    const std::string prefix = "/admin/workers/";
    const size_t slash = target.rfind('/');
    if (method == "POST" && target.rfind(prefix, 0) == 0 && slash > prefix.size()) {
      const std::string name = target.substr(prefix.size(), slash - prefix.size());
      const std::string verb = target.substr(slash + 1);
      pb::ControlAction action = verb == "drain"     ? pb::CONTROL_ACTION_DRAIN
                                 : verb == "undrain" ? pb::CONTROL_ACTION_UNDRAIN
                                 : verb == "recycle" ? pb::CONTROL_ACTION_RECYCLE
                                                     : pb::CONTROL_ACTION_UNSPECIFIED;
      if (action == pb::CONTROL_ACTION_UNSPECIFIED) {
        return Error(absl::InvalidArgumentError(
            absl::StrCat("action: '", verb, "' is not drain, undrain or recycle")));
      }
      absl::Status s = front_->core->Control(name, action);
      if (!s.ok()) return Error(s);
      return Respond(200, Dump({{"ok", true}, {"worker", name}, {"action", verb}}));
    }
    Respond(404, Dump({{"error",
                        {{"message", "unknown admin route"},
                         {"type", "not_found"},
                         {"param", nullptr},
                         {"code", nullptr}}}}));
  }

  void Tokenize(const std::string& body) {
    json j = json::parse(body, nullptr, false);
    if (j.is_discarded() || !j.is_object())
      return Error(absl::InvalidArgumentError("body: is not a JSON object"));
    ParsedRequest r;
    r.chat = j.contains("messages");
    if (r.chat) {
      j["model"] = front_->options.served_model_name;
      absl::StatusOr<ParsedRequest> p = ParseCompletionRequest(j.dump(), true);
      if (!p.ok()) return Error(p.status());
      r = *p;
    } else if (j.contains("prompt") && j["prompt"].is_string()) {
      r.prompt_text = j["prompt"].get<std::string>();
      if (j.contains("add_special_tokens")) {
        if (!j["add_special_tokens"].is_boolean()) {
          return Error(absl::InvalidArgumentError("add_special_tokens: must be a boolean"));
        }
        r.add_special_tokens = j["add_special_tokens"].get<bool>();
      }
    } else {
      return Error(absl::InvalidArgumentError("prompt: give 'prompt' (a string) or 'messages'"));
    }
    absl::StatusOr<std::vector<int>> ids = PromptIds(r);
    if (!ids.ok()) return Error(ids.status());
    Respond(200, Dump({{"tokens", *ids},
                       {"count", ids->size()},
                       {"max_model_len", front_->options.max_model_len}}));
  }

  void Detokenize(const std::string& body) {
    json j = json::parse(body, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("tokens") || !j["tokens"].is_array()) {
      return Error(absl::InvalidArgumentError("tokens: must be a list of token ids"));
    }
    std::vector<int> ids;
    for (const json& v : j["tokens"]) {
      if (!v.is_number_integer())
        return Error(absl::InvalidArgumentError("tokens: must be a list of token ids"));
      ids.push_back(v.get<int>());
    }
    absl::StatusOr<std::string> text = front_->tok->Decode(ids);
    if (!text.ok())
      return Error(absl::InvalidArgumentError(absl::StrCat("tokens: ", text.status().message())));
    Respond(200, Dump({{"prompt", *text}}));
  }

  tcp::socket socket_;
  HttpFront::Impl* front_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::deque<std::string> writes_;
  bool close_after_ = false;
  bool finished_ = false;
  ParsedRequest req_;
  std::string request_id_;
  int64_t created_ = 0;
  int prompt_tokens_ = 0;
  std::vector<Choice> choices_;
  std::map<int, bool> role_sent_;
  std::string endpoint_;
  std::string session_header_;
  std::chrono::steady_clock::time_point start_;
  bool first_token_seen_ = false;

  // Metric label: a known path, or "other" (labels must not grow with what clients send).
  std::string KnownEndpoint() const {
    for (const char* known : {"/v1/completions", "/v1/chat/completions", "/v1/models", "/tokenize",
                              "/detokenize", "/health", "/ready", "/metrics"}) {
      if (endpoint_ == known) return endpoint_;
    }
    return "other";
  }
};

}  // namespace

void HttpFront::Impl::Accept() {
  acceptor.async_accept([this](beast::error_code ec, tcp::socket socket) {
    if (ec) {
      if (ec != asio::error::operation_aborted) Accept();
      return;
    }
    std::make_shared<Session>(std::move(socket), this)->Start();
    Accept();
  });
}

absl::StatusOr<std::unique_ptr<HttpFront>> HttpFront::Start(const FrontOptions& options,
                                                            const tokenizer::Tokenizer* tokenizer,
                                                            RouterCore* core,
                                                            RouterMetrics* metrics) {
  std::unique_ptr<HttpFront> f(new HttpFront());
  f->impl_ = std::make_unique<Impl>();
  Impl& impl = *f->impl_;
  impl.options = options;
  impl.tok = tokenizer;
  impl.core = core;
  impl.metrics = metrics;
  impl.id_prefix = absl::StrFormat("%08x-", std::random_device{}());
  beast::error_code ec;
  tcp::endpoint ep(asio::ip::make_address(options.host, ec),
                   static_cast<unsigned short>(options.port));
  if (ec)
    return absl::InvalidArgumentError(absl::StrCat("--host ", options.host, ": ", ec.message()));
  impl.acceptor.open(ep.protocol(), ec);
  if (!ec) impl.acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) impl.acceptor.bind(ep, ec);
  if (!ec) impl.acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return absl::UnavailableError(absl::StrCat("--port ", options.port, ": ", ec.message()));
  impl.Accept();
  f->thread_ = std::thread([&impl] {
    auto guard = asio::make_work_guard(impl.io);
    impl.io.run();
  });
  return f;
}

int HttpFront::port() const { return impl_->acceptor.local_endpoint().port(); }

void HttpFront::Stop() {
  if (!thread_.joinable()) return;
  impl_->io.stop();
  thread_.join();
}

HttpFront::~HttpFront() { Stop(); }

}  // namespace kvserve::router
