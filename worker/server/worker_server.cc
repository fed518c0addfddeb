#include "worker/server/worker_server.h"

#include <algorithm>
#include <fstream>
#include <optional>
#include <random>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/zmq_framing.h"
#include "glog/logging.h"

namespace kvserve::worker {
namespace {

namespace pb = ::kvserve::v1;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

double RssMb() {
  std::ifstream in("/proc/self/statm");
  long pages = 0, resident = 0;
  in >> pages >> resident;
  return resident * 4096.0 / 1048576.0;
}

pb::Medium ToProto(Medium m) { return m == Medium::kHost ? pb::MEDIUM_HOST : pb::MEDIUM_DEVICE; }

std::optional<structured::ConstraintSpec> ConstraintFromProto(const pb::Constraint& c) {
  structured::ConstraintSpec spec;
  if (c.has_reasoning()) {
    spec.reasoning = {c.reasoning().start(), c.reasoning().end(), c.reasoning().inside()};
  }
  switch (c.kind_case()) {
    case pb::Constraint::kRegex:
      spec.regex = c.regex();
      return spec;
    case pb::Constraint::kChoice:
      spec.kind = structured::ConstraintSpec::Kind::kChoice;
      spec.choices.assign(c.choice().choices().begin(), c.choice().choices().end());
      return spec;
    case pb::Constraint::kJsonSchema:
      spec.kind = structured::ConstraintSpec::Kind::kJsonSchema;
      spec.json_schema = c.json_schema();
      return spec;
    case pb::Constraint::kJsonObject:
      spec.kind = structured::ConstraintSpec::Kind::kJsonObject;
      return spec;
    case pb::Constraint::kGrammar:
      spec.kind = structured::ConstraintSpec::Kind::kGrammar;
      spec.grammar = c.grammar();
      return spec;
    default:
      return std::nullopt;
  }
}

void ToProto(const TokenLogprobs& lp, pb::PositionLogprobs* p) {
  p->mutable_sampled()->set_token_id(lp.token);
  p->mutable_sampled()->set_logprob(lp.logprob);
  p->set_rank(lp.rank);
  for (auto [tok, logprob] : lp.top) {
    pb::TokenLogprob* t = p->add_top();
    t->set_token_id(tok);
    t->set_logprob(logprob);
  }
}

pb::FinishReason ToProto(FinishReason r) {
  switch (r) {
    case FinishReason::kStop:
      return pb::FINISH_REASON_STOP;
    case FinishReason::kLength:
      return pb::FINISH_REASON_LENGTH;
    case FinishReason::kAbort:
      return pb::FINISH_REASON_ABORT;
    default:
      return pb::FINISH_REASON_UNSPECIFIED;
  }
}

// Binds to host:port (port 0: any free port) and returns the port bound.
absl::StatusOr<int> Bind(zmq::socket_t& s, const std::string& host, int port, const char* flag) {
  const std::string ep =
      absl::StrCat("tcp://", host, ":", port == 0 ? std::string("*") : std::to_string(port));
  try {
    s.bind(ep);
    const std::string last = s.get(zmq::sockopt::last_endpoint);
    return std::stoi(last.substr(last.rfind(':') + 1));
  } catch (const zmq::error_t& e) {
    return absl::UnavailableError(
        absl::StrCat(flag, " ", port, ": cannot bind ", ep, ": ", e.what()));
  }
}

// The logits adjustments of `sp` (ranges and order are the engine's to check and make).
void CopyAdjustments(const pb::SamplingParams& sp, SamplingParams& out) {
  out.presence_penalty = sp.presence_penalty();
  out.frequency_penalty = sp.frequency_penalty();
  out.repetition_penalty = sp.repetition_penalty() == 0 ? 1.0f : sp.repetition_penalty();
  out.min_tokens = sp.min_tokens();
  out.logit_bias.assign(sp.logit_bias().begin(), sp.logit_bias().end());
  for (const pb::TokenIds& word : sp.bad_words()) {
    out.bad_words.emplace_back(word.ids().begin(), word.ids().end());
  }
  out.allowed_token_ids.assign(sp.allowed_token_ids().begin(), sp.allowed_token_ids().end());
}

}  // namespace

absl::StatusOr<std::unique_ptr<WorkerServer>> WorkerServer::Create(
    const WorkerServerOptions& options, std::unique_ptr<Engine> engine) {
  std::unique_ptr<WorkerServer> s(new WorkerServer());
  s->options_ = options;
  s->engine_ = std::move(engine);
  s->instance_id_ = std::random_device{}() | (static_cast<uint64_t>(std::random_device{}()) << 32);
  s->router_ = std::make_unique<zmq::socket_t>(s->ctx_, zmq::socket_type::router);
  s->pub_ = std::make_unique<zmq::socket_t>(s->ctx_, zmq::socket_type::pub);
  s->router_->set(zmq::sockopt::linger, 0);
  s->pub_->set(zmq::sockopt::linger, 200);
  // Event batches are small; a deep queue keeps a briefly slow subscriber from losing any
  // (one that still loses some sees the gap in seq and resyncs from a snapshot).
  s->pub_->set(zmq::sockopt::sndhwm, 100000);
  // A reply that cannot go out now waits in the reply queue instead of vanishing (without
  // ROUTER_MANDATORY, ZeroMQ drops it silently past the high-water mark).
  s->router_->set(zmq::sockopt::router_mandatory, true);
  s->replies_ = std::make_unique<ReplyQueue>(
      s->router_.get(),
      std::chrono::milliseconds(absl::ToInt64Milliseconds(options.reply_give_up)));
  if (!options.curve_secret_key.empty()) {
    ASSIGN_OR_RETURN(s->zap_, ZapAuthenticator::Start(s->ctx_, options.curve_allowed_clients_dir));
    RETURN_IF_ERROR(MakeCurveServer(*s->router_, options.curve_secret_key));
    RETURN_IF_ERROR(MakeCurveServer(*s->pub_, options.curve_secret_key));
  }
  ASSIGN_OR_RETURN(s->port_, Bind(*s->router_, options.host, options.port, "--port"));
  ASSIGN_OR_RETURN(s->events_port_,
                   Bind(*s->pub_, options.host, options.events_port, "--events-port"));
  const EngineStats st = s->engine_->stats();
  const EngineConfig& config = s->engine_->config();
  CacheConfigInfo info{config.cache.block_size,
                       s->engine_->kv_spec().CacheKeyDType(),
                       st.blocks_total,
                       st.host_blocks_total,
                       config.cache.enable_prefix_caching,
                       config.parallel.tensor_parallel_size};
  s->metrics_ = std::make_unique<WorkerMetrics>(options.worker_id, config.model_id, info,
                                                options.vllm_metric_names);
  s->metrics_->StartRecycleCounts(options.earlier_recycles);
  WorkerServer* self = s.get();
  ASSIGN_OR_RETURN(
      s->http_, HttpServer::Start(options.metrics_host, options.metrics_port,
                                  [self](const std::string& method, const std::string& target) {
                                    HttpResponse r;
                                    if (method != "GET") {
                                      r.status = 405;
                                      r.body = "only GET\n";
                                    } else if (target == "/metrics") {
                                      r.content_type = "text/plain; version=0.0.4; charset=utf-8";
                                      r.body = self->metrics_->Serialize();
                                    } else if (target == "/health") {
                                      r.body = "ok\n";
                                    } else if (target == "/ready") {
                                      const bool ready =
                                          self->state_.load() == pb::WORKER_STATE_READY;
                                      r.status = ready ? 200 : 503;
                                      r.body = ready ? "ready\n" : "not ready\n";
                                    } else {
                                      r.status = 404;
                                      r.body = "not found\n";
                                    }
                                    return r;
                                  }));
  s->engine_->SetKvEventListener(s.get());
  s->started_ = Clock::now();
  s->start_rss_mb_ = RssMb();
  return s;
}

void WorkerServer::OnKvEvent(const BlockHash& hash, bool stored, Medium medium) {
  pb::KvEvent e;
  const auto fill = [&](auto* change) {
    change->add_block_hashes(hash.ToBytes());
    change->set_medium(ToProto(medium));
  };
  if (stored) {
    fill(e.mutable_stored());
  } else {
    fill(e.mutable_removed());
  }
  pending_events_.push_back(std::move(e));
}

WorkerServer::~WorkerServer() {
  if (http_) http_->Stop();
  router_.reset();
  pub_.reset();
  zap_.reset();
  ctx_.close();
}

void WorkerServer::Reply(const std::string& identity, const google::protobuf::Message& m) {
  replies_->Send(identity, m);
}

void WorkerServer::Respond(Route& route, pb::GenerateResponse& r) {
  r.set_seq(++route.seq);
  Reply(route.identity, r);
}

void WorkerServer::FlushReplies() {
  for (const std::string& peer : replies_->Flush(Clock::now())) {
    // Nobody will read these requests' answers: stop them.
    for (auto it = routes_.begin(); it != routes_.end();) {
      if (it->second.identity != peer) {
        ++it;
        continue;
      }
      engine_->Abort(it->first).IgnoreError();
      metrics_->CountRequestEnd("abort");
      routes_.erase(it++);
    }
  }
}

void WorkerServer::Publish(const std::string& topic, const google::protobuf::Message& m) {
  absl::Status s = SendMessage(*pub_, topic, m, zmq::send_flags::dontwait);
  if (!s.ok()) LOG(WARNING) << "publish " << topic << ": " << s;
}

void WorkerServer::SendError(const std::string& identity, const std::string& request_id,
                             const absl::Status& status, uint32_t seq) {
  pb::GenerateResponse r;
  r.set_request_id(request_id);
  r.set_seq(seq);
  r.set_finish_reason(pb::FINISH_REASON_ERROR);
  r.mutable_error()->set_code(static_cast<int>(status.code()));
  r.mutable_error()->set_message(std::string(status.message()));
  Reply(identity, r);
}

void WorkerServer::HandleMessage(const ReceivedMessage& m) {
  if (m.type == "GenerateRequest") {
    pb::GenerateRequest req;
    if (absl::Status s = ParseMessage(m, &req); !s.ok()) {
      metrics_->CountDropped("malformed_payload");
      SendError(m.prefix, "", s, /*seq=*/0);
      return;
    }
    HandleGenerate(m.prefix, req);
  } else if (m.type == "AbortRequest") {
    pb::AbortRequest req;
    if (!ParseMessage(m, &req).ok()) {
      metrics_->CountDropped("malformed_payload");
      return;
    }
    auto it = routes_.find(req.request_id());
    if (it == routes_.end() || !engine_->Abort(req.request_id()).ok()) {
      metrics_->CountDropped("abort_unknown_request");
      return;
    }
    pb::GenerateResponse r;
    r.set_request_id(req.request_id());
    r.set_finish_reason(pb::FINISH_REASON_ABORT);
    r.mutable_error()->set_code(static_cast<int>(absl::StatusCode::kCancelled));
    r.mutable_error()->set_message(req.reason().empty() ? "aborted" : req.reason());
    Respond(it->second, r);
    routes_.erase(it);
    metrics_->CountRequestEnd("abort");
  } else if (m.type == "Control") {
    pb::Control c;
    if (!ParseMessage(m, &c).ok()) {
      metrics_->CountDropped("malformed_payload");
      pb::ControlReply r;
      r.mutable_error()->set_code(static_cast<int>(absl::StatusCode::kInvalidArgument));
      r.mutable_error()->set_message("malformed Control payload");
      Reply(m.prefix, r);
      return;
    }
    HandleControl(m.prefix, c);
  } else {
    metrics_->CountDropped("unknown_type");
    pb::ControlReply r;
    r.mutable_error()->set_code(static_cast<int>(absl::StatusCode::kInvalidArgument));
    r.mutable_error()->set_message(
        absl::StrCat("unknown message type '", absl::CHexEscape(m.type.substr(0, 64)), "'"));
    Reply(m.prefix, r);
  }
}

void WorkerServer::HandleGenerate(const std::string& identity, const pb::GenerateRequest& req) {
  if (draining_) {
    SendError(
        identity, req.request_id(),
        absl::FailedPreconditionError(absl::StrCat("worker is draining (", drain_reason_, ")")));
    return;
  }
  if (routes_.contains(req.request_id())) {
    metrics_->CountDropped("duplicate_request_id");
    SendError(identity, req.request_id(),
              absl::AlreadyExistsError(
                  absl::StrCat("request '", req.request_id(), "' is already running")));
    return;
  }
  RequestInput in;
  in.request_id = req.request_id();
  in.prompt.assign(req.prompt_token_ids().begin(), req.prompt_token_ids().end());
  in.max_tokens = req.max_tokens();
  in.stop_token_ids.assign(req.stop_token_ids().begin(), req.stop_token_ids().end());
  in.priority = req.priority();
  in.cache_salt = req.cache_salt();
  const pb::SamplingParams& sp = req.sampling();
  in.sampling.temperature = sp.temperature();
  in.sampling.top_p = sp.top_p() == 0 ? 1.0f : sp.top_p();
  in.sampling.top_k = sp.top_k();
  in.sampling.min_p = sp.min_p();
  if (sp.has_seed()) in.sampling.seed = sp.seed();
  if (sp.has_logprobs()) in.sampling.logprobs = sp.logprobs();
  if (sp.has_prompt_logprobs()) in.sampling.prompt_logprobs = sp.prompt_logprobs();
  in.constraint = ConstraintFromProto(sp.constraint());
  in.sampling.ignore_eos = sp.ignore_eos();
  in.sampling.n = sp.n() == 0 ? 1 : sp.n();
  CopyAdjustments(sp, in.sampling);
  const int n = in.sampling.n;
  if (absl::Status s = engine_->AddRequest(std::move(in)); !s.ok()) {
    SendError(identity, req.request_id(), s);
    return;
  }
  Route route;
  route.identity = identity;
  route.stream = req.stream();
  route.arrival = Clock::now();
  route.predicted_cached = req.predicted_cached_tokens();
  if (!route.stream) route.pending.resize(n);
  routes_.emplace(req.request_id(), std::move(route));
}

void WorkerServer::HandleControl(const std::string& identity, const pb::Control& c) {
  pb::ControlReply r;
  r.set_control_id(c.control_id());
  r.set_ok(true);
  switch (c.action()) {
    case pb::CONTROL_ACTION_DRAIN:
      StartDrain(c.reason().empty() ? "admin" : c.reason(), /*recycle=*/false);
      break;
    case pb::CONTROL_ACTION_UNDRAIN:
      if (recycle_after_drain_ || stop_after_drain_) {
        r.set_ok(false);
        r.mutable_error()->set_message("a recycle or shutdown drain cannot be undone");
      } else {
        draining_ = false;
        state_ = pb::WORKER_STATE_READY;
      }
      break;
    case pb::CONTROL_ACTION_RECYCLE_GRANT:
      if (c.instance_id() != 0 && c.instance_id() != instance_id_) {
        r.set_ok(false);
        r.mutable_error()->set_message("the grant is for an earlier instance of this worker");
        break;
      }
      if (draining_) break;  // a second replica's grant for the same slot: already held
      grant_pending_ = true;
      grant_ms_ = NowMs();
      granted_by_ = c.coordinator_id();
      grant_commit_ = Clock::now() + std::chrono::milliseconds(
                                         absl::ToInt64Milliseconds(options_.recycle_grant_hold));
      StartDrain(c.reason().empty() ? "recycle" : c.reason(), /*recycle=*/true);
      break;
    case pb::CONTROL_ACTION_RECYCLE_REVOKE:
      if (!grant_pending_ || Clock::now() >= grant_commit_) {
        r.set_ok(false);
        r.mutable_error()->set_message("no revocable recycle grant (none, or already committed)");
        break;
      }
      LOG(INFO) << "recycle grant revoked by " << c.coordinator_id();
      grant_pending_ = false;
      recycle_after_drain_ = false;
      recycle_requested_ = false;  // ask again later
      if (stop_after_drain_) {
        state_ = pb::WORKER_STATE_DRAINING;  // a SIGTERM came meanwhile: keep stopping
      } else {
        draining_ = false;
        state_ = pb::WORKER_STATE_READY;
      }
      PublishStatus();
      break;
    case pb::CONTROL_ACTION_RECYCLE:
      StartDrain(c.reason().empty() ? "recycle" : c.reason(), /*recycle=*/true);
      break;
    case pb::CONTROL_ACTION_RECYCLE_DENY:
      recycle_requested_ = false;  // ask again later
      break;
    case pb::CONTROL_ACTION_SNAPSHOT_REQUEST:
      PublishSnapshot();
      break;
    default:
      r.set_ok(false);
      r.mutable_error()->set_code(static_cast<int>(absl::StatusCode::kInvalidArgument));
      r.mutable_error()->set_message(absl::StrCat("unsupported control action ", c.action()));
      metrics_->CountDropped("bad_control_action");
  }
  Reply(identity, r);
}

void WorkerServer::StartDrain(const std::string& reason, bool recycle) {
  if (recycle) recycle_after_drain_ = true;
  if (draining_) return;
  draining_ = true;
  drain_reason_ = reason;
  drain_deadline_ =
      Clock::now() + std::chrono::milliseconds(absl::ToInt64Milliseconds(options_.drain_timeout));
  state_ = recycle ? pb::WORKER_STATE_RECYCLING : pb::WORKER_STATE_DRAINING;
  LOG(INFO) << "draining: " << reason;
  PublishStatus();
}

void WorkerServer::SendOutputs(std::vector<SequenceOutput>& outs) {
  const auto now = Clock::now();
  // Before the replies go out: a client that scrapes /metrics after its answer sees its request
  // counted, not the last heartbeat's numbers.
  if (std::any_of(outs.begin(), outs.end(),
                  [](const SequenceOutput& o) { return o.request_finished; })) {
    UpdateMetrics(/*refresh_kv_usage=*/false);
  }
  for (SequenceOutput& o : outs) {
    auto it = routes_.find(o.request_id);
    if (it == routes_.end()) continue;
    Route& route = it->second;
    route.completion_tokens += static_cast<int>(o.new_tokens.size());
    if (!o.new_tokens.empty()) {
      if (route.first_token == Clock::time_point()) {
        route.first_token = now;
        metrics_->ObserveFirstToken(Seconds(now - route.arrival));
      } else {
        metrics_->ObserveInterToken(Seconds(now - route.last_token));
      }
      route.last_token = now;
    }
    pb::GenerateResponse delta;
    delta.set_request_id(o.request_id);
    delta.set_sample_index(o.sample_index);
    for (int32_t t : o.new_tokens) delta.add_token_ids(t);
    for (const TokenLogprobs& lp : o.new_logprobs) ToProto(lp, delta.add_logprobs());
    for (const TokenLogprobs& lp : o.prompt_logprobs) ToProto(lp, delta.add_prompt_logprobs());
    delta.set_finish_reason(ToProto(o.finish_reason));
    if (o.stop_token) delta.set_stop_token_id(*o.stop_token);
    if (o.request_finished) {
      pb::Usage* u = delta.mutable_usage();
      u->set_prompt_tokens(o.num_prompt_tokens);
      u->set_cached_prompt_tokens(o.num_cached_prompt_tokens);
      // Counted before the last reply goes out (a scrape after the answer sees it).
      const double e2e = Seconds(now - route.arrival);
      const auto scheduled = route.scheduled == Clock::time_point() ? now : route.scheduled;
      const double tpot =
          route.completion_tokens > 1
              ? Seconds(route.last_token - route.first_token) / (route.completion_tokens - 1)
              : 0;
      metrics_->ObserveFinished(e2e, Seconds(scheduled - route.arrival), tpot,
                                o.finish_reason == FinishReason::kLength ? "length" : "stop");
    }
    if (route.stream) {
      Respond(route, delta);
    } else {
      pb::GenerateResponse& acc = route.pending[o.sample_index];
      acc.set_request_id(o.request_id);
      acc.set_sample_index(o.sample_index);
      acc.mutable_token_ids()->MergeFrom(delta.token_ids());
      acc.mutable_logprobs()->MergeFrom(delta.logprobs());
      acc.mutable_prompt_logprobs()->MergeFrom(delta.prompt_logprobs());
      if (delta.finish_reason() != pb::FINISH_REASON_UNSPECIFIED) {
        acc.set_finish_reason(delta.finish_reason());
        if (delta.has_stop_token_id()) acc.set_stop_token_id(delta.stop_token_id());
      }
      if (o.request_finished) *acc.mutable_usage() = delta.usage();
    }
    if (o.request_finished) {
      if (!route.stream) {
        int completion = 0;
        for (const auto& p : route.pending) completion += p.token_ids_size();
        for (auto& p : route.pending) {
          if (p.has_usage()) p.mutable_usage()->set_completion_tokens(completion);
          Respond(route, p);
        }
      }
      ++served_requests_;
      routes_.erase(it);
    }
  }
}

void WorkerServer::PublishEvents() {
  if (pending_events_.empty()) return;
  pb::KvEventBatch batch;
  batch.set_worker_id(options_.worker_id);
  batch.set_instance_id(instance_id_);
  batch.set_seq(++event_seq_);
  batch.set_timestamp_ms(NowMs());
  for (auto& e : pending_events_) *batch.add_events() = std::move(e);
  pending_events_.clear();
  Publish("kv", batch);
}

void WorkerServer::PublishAllCleared() {
  pending_events_.clear();
  pb::KvEvent e;
  e.mutable_all_cleared();
  pending_events_.push_back(std::move(e));
  PublishEvents();
}

void WorkerServer::PublishSnapshot() {
  PublishEvents();  // the snapshot is valid after every event so far
  pb::KvSnapshot snap;
  snap.set_worker_id(options_.worker_id);
  snap.set_instance_id(instance_id_);
  snap.set_seq(event_seq_);
  engine_->ForEachCachedBlock([&](const BlockHash& h, Medium m) {
    pb::CachedBlock* b = snap.add_blocks();
    b->set_block_hash(h.ToBytes());
    b->set_medium(ToProto(m));
  });
  Publish("kv", snap);
}

void WorkerServer::PublishStatus() {
  const EngineStats s = engine_->stats();
  pb::WorkerStatus st;
  st.set_worker_id(options_.worker_id);
  st.set_instance_id(instance_id_);
  st.set_state(static_cast<pb::WorkerState>(state_.load()));
  if (grant_pending_ && Clock::now() < grant_commit_) {
    st.set_recycle_pending(true);
    st.set_recycle_grant_ms(grant_ms_);
    st.set_recycle_granted_by(granted_by_);
  }
  for (bool host : {false, true}) {
    pb::BlockCounts* b = st.add_blocks();
    b->set_medium(host ? pb::MEDIUM_HOST : pb::MEDIUM_DEVICE);
    const int total = host ? s.host_blocks_total : s.blocks_total;
    const int free = host ? s.host_blocks_free : s.blocks_free;
    const int cached = host ? s.host_blocks_cached_evictable : s.blocks_cached_evictable;
    b->set_total(total);
    b->set_free(free - cached);
    b->set_active(total - free);
    b->set_cached_evictable(cached);
  }
  st.set_num_running(s.num_running);
  st.set_num_waiting(s.num_waiting);
  st.set_num_swapped(s.num_swapped);
  st.set_tokens_in_flight(engine_->kv_usage().used_tokens);
  st.set_load(s.blocks_total > 0
                  ? static_cast<double>(s.blocks_total - s.blocks_free) / s.blocks_total +
                        static_cast<double>(s.num_waiting) /
                            std::max(1, engine_->config().scheduler.max_num_seqs)
                  : 0);
  st.set_kv_event_seq(event_seq_);
  st.set_block_size(engine_->config().cache.block_size);
  st.set_timestamp_ms(NowMs());
  st.set_model_id(engine_->config().model_id);
  st.set_kv_cache_dtype(engine_->kv_spec().CacheKeyDType());
  st.set_kv_quant(engine_->kv_spec().CacheKeyQuant());
  st.set_tensor_parallel_size(engine_->config().parallel.tensor_parallel_size);
  st.set_max_num_seqs(engine_->config().scheduler.max_num_seqs);
  Publish("status", st);
}

bool WorkerServer::RecycleDue(std::string* reason) {
  const RecyclePolicy& p = options_.recycle;
  if (p.after_requests > 0 && served_requests_ >= p.after_requests)
    *reason = "requests";
  else if (p.after_seconds > 0 && Seconds(Clock::now() - started_) >= p.after_seconds)
    *reason = "uptime";
  else if (p.on_rss_growth_mb > 0 && RssMb() - start_rss_mb_ >= p.on_rss_growth_mb)
    *reason = "rss_growth";
  else if (p.on_fragmentation > 0) {
    const Engine::KvUsage u = engine_->kv_usage();
    if (u.allocated_slots > 0 &&
        1.0 - static_cast<double>(u.used_tokens) / u.allocated_slots >= p.on_fragmentation) {
      *reason = "fragmentation";
    }
  }
  return !reason->empty();
}

void WorkerServer::UpdateMetrics(bool refresh_kv_usage) {
  if (refresh_kv_usage) kv_usage_ = engine_->kv_usage();
  if (zap_) metrics_->UpdateAuthentications(zap_->accepted(), zap_->refused());
  metrics_->UpdateReplies(replies_->waiting(), replies_->waited(), replies_->dropped());
  metrics_->Update(engine_->stats(), kv_usage_.allocated_slots, kv_usage_.used_tokens, draining_,
                   Seconds(Clock::now() - started_), event_seq_);
}

absl::StatusOr<WorkerServer::Exit> WorkerServer::Run(const std::atomic<bool>* stop) {
  PublishAllCleared();  // a fresh process holds nothing
  state_ = pb::WORKER_STATE_READY;
  PublishStatus();
  next_heartbeat_ =
      Clock::now() + std::chrono::milliseconds(absl::ToInt64Milliseconds(options_.heartbeat));
  while (true) {
    RETURN_IF_ERROR(ReceiveMessages());
    if (stop != nullptr && stop->load() && !stop_after_drain_) {
      stop_after_drain_ = true;
      if (draining_) {  // a SIGTERM during a drain (a recycle's): it ends in a stop
        LOG(INFO) << "draining: sigterm (during the " << drain_reason_ << " drain)";
        state_ = pb::WORKER_STATE_DRAINING;
        PublishStatus();
      }
      StartDrain("sigterm", /*recycle=*/false);
    }
    if (engine_->HasWork()) RETURN_IF_ERROR(StepEngine());
    FlushReplies();
    PublishEvents();
    const auto now = Clock::now();
    if (now >= next_heartbeat_) Heartbeat(now);
    if (draining_ && (recycle_after_drain_ || stop_after_drain_)) {
      if (std::optional<Exit> exit = ContinueDrain(now)) return *exit;
    }
  }
}

absl::Status WorkerServer::ReceiveMessages() {
  zmq::pollitem_t items[] = {{router_->handle(), 0, ZMQ_POLLIN, 0}};
  try {
    // Replies that wait for a slow router are retried often (ZeroMQ cannot say when a peer's
    // queue has room).
    const int wait_ms = engine_->HasWork() ? 0 : replies_->waiting() > 0 ? 1 : 10;
    zmq::poll(items, 1, std::chrono::milliseconds(wait_ms));
  } catch (const zmq::error_t& e) {
    if (e.num() != EINTR) return absl::InternalError(absl::StrCat("zmq poll: ", e.what()));
  }
  for (int i = 0; i < 256; ++i) {  // drain what arrived, bounded so steps keep flowing
    absl::StatusOr<std::optional<ReceivedMessage>> m =
        ReceiveMessage(*router_, true, zmq::recv_flags::dontwait);
    if (!m.ok()) {
      metrics_->CountDropped("malformed_frames");
      continue;
    }
    if (!m->has_value()) break;
    HandleMessage(**m);
  }
  return absl::OkStatus();
}

absl::Status WorkerServer::StepEngine() {
  absl::StatusOr<std::vector<SequenceOutput>> outs = engine_->Step();
  if (!outs.ok()) {
    state_ = pb::WORKER_STATE_STOPPING;
    for (auto& [id, route] : routes_) SendError(route.identity, id, outs.status(), ++route.seq);
    PublishStatus();
    return outs.status();
  }
  const auto stepped = Clock::now();
  for (auto& [id, route] : routes_) {  // queue time ends at the first scheduling
    if (route.scheduled == Clock::time_point() && engine_->Started(id)) route.scheduled = stepped;
  }
  SendOutputs(*outs);
  return absl::OkStatus();
}

void WorkerServer::Heartbeat(Clock::time_point now) {
  UpdateMetrics();
  PublishStatus();
  next_heartbeat_ = now + std::chrono::milliseconds(absl::ToInt64Milliseconds(options_.heartbeat));
  // Ask for a recycle slot, and keep asking every heartbeat until granted: PUB drops messages
  // for subscribers that are not connected yet, and a denied ask is retried.
  std::string reason;
  if (draining_ || !RecycleDue(&reason)) return;
  pb::Control ask;
  ask.set_action(pb::CONTROL_ACTION_RECYCLE_REQUEST);
  ask.set_reason(reason);
  ask.set_instance_id(instance_id_);
  Publish("control", ask);
  if (!recycle_requested_) LOG(INFO) << "asking for a recycle slot: " << reason;
  recycle_requested_ = true;
}

std::optional<WorkerServer::Exit> WorkerServer::ContinueDrain(Clock::time_point now) {
  if (engine_->HasWork() && now >= drain_deadline_) AbortForDrainTimeout();
  if (!engine_->HasWork() && idle_since_ == Clock::time_point()) idle_since_ = now;
  if (engine_->HasWork()) idle_since_ = Clock::time_point();
  // Idle: keep answering "draining" for a short grace period, so that a request already on
  // the wire gets a retryable error instead of vanishing with the process.
  if (grant_pending_ && now >= grant_commit_) grant_pending_ = false;  // committed
  // A held grant is never acted on: it may still be revoked.
  if (grant_pending_ || engine_->HasWork() || now - idle_since_ < std::chrono::milliseconds(200)) {
    return std::nullopt;
  }
  if (recycle_after_drain_ && !stop_after_drain_) metrics_->CountRecycle(drain_reason_);
  state_ = pb::WORKER_STATE_STOPPING;
  UpdateMetrics();
  PublishAllCleared();
  PublishStatus();
  // A SIGTERM during a recycle drain wins: the process is being stopped, not replaced.
  return recycle_after_drain_ && !stop_after_drain_ ? Exit::kRecycle : Exit::kStopped;
}

void WorkerServer::AbortForDrainTimeout() {
  for (const std::string& id : engine_->AbortAll()) {
    auto it = routes_.find(id);
    if (it == routes_.end()) continue;
    pb::GenerateResponse r;
    r.set_request_id(id);
    r.set_finish_reason(pb::FINISH_REASON_ABORT);
    r.mutable_error()->set_code(static_cast<int>(absl::StatusCode::kUnavailable));
    r.mutable_error()->set_message(
        absl::StrCat("aborted: the worker's drain timeout passed (", drain_reason_, ")"));
    Respond(it->second, r);
    routes_.erase(it);
    metrics_->CountRequestEnd("abort");
  }
}

}  // namespace kvserve::worker
