// WorkerServer: construction and the serving loop (Run: receive, step, flush, publish,
// heartbeat, drain). The loop's jobs live beside it, one file each: worker_dispatch.cc
// (requests in, replies out), worker_liveness.cc (heartbeats and metrics), worker_drain.cc
// (control, drain and recycle); its parts (the KV events, links, streams and transfers) have
// headers of their own; wire.h converts the messages.
#include "worker/server/worker_server.h"

#include <random>

#include "absl/strings/str_cat.h"
#include "common/net/zmq_framing.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "worker/server/process_clock.h"

namespace kvserve::worker {

namespace pb = ::kvserve::v1;

absl::Status CheckLinkOptions(const WorkerServerOptions& options) {
  if (options.link_port < 0 || options.curve_secret_key.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      "--link-port: the framed link carries no CURVE authentication (nor TLS) yet; a worker "
      "with CURVE keys serves routers on its ZeroMQ --port only");
}

absl::StatusOr<std::unique_ptr<WorkerServer>> WorkerServer::Create(
    const WorkerServerOptions& options, std::unique_ptr<Engine> engine) {
  std::unique_ptr<WorkerServer> s(new WorkerServer());
  KVSERVE_CHECK_THREAD(s->loop_thread_);
  s->options_ = options;
  s->engine_ = std::move(engine);
  s->drain_ = std::make_unique<Drain>(
      std::chrono::milliseconds(absl::ToInt64Milliseconds(options.drain_timeout)),
      std::chrono::milliseconds(absl::ToInt64Milliseconds(options.recycle_grant_hold)));
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
  RETURN_IF_ERROR(CheckLinkOptions(options));
  if (options.link_port >= 0) {
    ASSIGN_OR_RETURN(s->links_, LinkServer::Listen(options.host, options.link_port));
    s->link_port_ = s->links_->port();
  }
  s->publisher_ = std::make_unique<Publisher>(s->pub_.get(), s->links_.get());
  s->replies_ = std::make_unique<ReplyQueue>(
      s->router_.get(), s->links_.get(),
      std::chrono::milliseconds(absl::ToInt64Milliseconds(options.reply_give_up)));
  if (!options.curve_secret_key.empty()) {
    ASSIGN_OR_RETURN(s->zap_, ZapAuthenticator::Start(s->ctx_, options.curve_allowed_clients_dir,
                                                      options.curve_also_allowed));
    RETURN_IF_ERROR(MakeCurveServer(*s->router_, options.curve_secret_key));
    RETURN_IF_ERROR(MakeCurveServer(*s->pub_, options.curve_secret_key));
  }
  ASSIGN_OR_RETURN(s->port_, BindTcp(*s->router_, options.host, options.port, "--port"));
  ASSIGN_OR_RETURN(s->events_port_,
                   BindTcp(*s->pub_, options.host, options.events_port, "--events-port"));
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
  if (s->engine_->KvWireBlockBytes() > 0) {
    s->metrics_->StartKvTransfer(s->engine_->kv_spec().CacheKeyDType());
  }
  s->MakeKvParts();
  WorkerServer* self = s.get();
  ASSIGN_OR_RETURN(s->http_,
                   HttpServer::Start(options.metrics_host, options.metrics_port,
                                     [self](const std::string& method, const std::string& target) {
                                       return self->Probe(method, target);
                                     }));
  std::unique_ptr<VllmEventPublisher> vllm;
  if (options.vllm_events) {
    ASSIGN_OR_RETURN(vllm, VllmEventPublisher::Start(s->ctx_, *options.vllm_events));
    LOG(INFO) << "vLLM KV events on " << vllm->endpoint()
              << (options.vllm_events->replay_endpoint
                      ? absl::StrCat(", replay on ", vllm->replay_endpoint())
                      : std::string());
  }
  // vLLM's events name each stored block's tokens and parent: the cache keeps them then.
  const bool contents = vllm != nullptr;
  s->kv_events_ = std::make_unique<KvEventFeed>(
      KvEventFeed::Options{.worker_id = options.worker_id,
                           .instance_id = s->instance_id_,
                           .block_size = config.cache.block_size,
                           .vllm_encoding = options.vllm_events_encoding},
      s->publisher_.get(), std::move(vllm));
  s->engine_->SetKvEventListener(s->kv_events_.get(), contents);
  s->started_ = Clock::now();
  s->start_rss_mb_ = RssMb();
  // The server and its engine go to the thread that calls Run.
  s->engine_->HandOver();
  s->loop_thread_.Detach();
  return s;
}

HttpResponse WorkerServer::Probe(const std::string& method, const std::string& target) const {
  HttpResponse r;
  if (method != "GET") {
    r.status = 405;
    r.body = "only GET\n";
  } else if (target == "/metrics") {
    r.content_type = "text/plain; version=0.0.4; charset=utf-8";
    r.body = metrics_->Serialize();
  } else if (target == "/health") {
    r.body = "ok\n";
  } else if (target == "/ready") {
    const bool ready = state_.load() == pb::WORKER_STATE_READY;
    r.status = ready ? 200 : 503;
    r.body = ready ? "ready\n" : "not ready\n";
  } else {
    r.status = 404;
    r.body = "not found\n";
  }
  return r;
}

WorkerServer::~WorkerServer() {
  if (http_) http_->Stop();
  router_.reset();
  pub_.reset();
  if (kv_events_) kv_events_->Close();  // vLLM's publisher: its sockets close before the context
  zap_.reset();
  ctx_.close();
}

absl::StatusOr<WorkerServer::Exit> WorkerServer::Run(const std::atomic<bool>* stop) {
  KVSERVE_CHECK_THREAD(loop_thread_);
  kv_events_->PublishAllCleared();  // a fresh process holds nothing
  // Every series exists before /ready answers 200: an autoscaler or an endpoint picker that
  // scrapes at start sees them at their values, not absent until the first heartbeat.
  UpdateMetrics();
  state_ = pb::WORKER_STATE_READY;
  PublishStatus();
  next_heartbeat_ =
      Clock::now() + std::chrono::milliseconds(absl::ToInt64Milliseconds(options_.heartbeat));
  while (true) {
    RETURN_IF_ERROR(ReceiveMessages());
    if (stop != nullptr && stop->load() && drain_->Stop(Clock::now())) PublishState();
    if (engine_->HasWork()) RETURN_IF_ERROR(StepEngine());
    kv_links_->PollJoins();
    kv_transfers_->AdvanceLinkExports();
    layer_streams_->Poll();
    kv_events_->Publish();
    const auto now = Clock::now();
    if (now >= next_heartbeat_) Heartbeat(now);
    if (now >= next_load_report_) {
      next_load_report_ =
          now + std::chrono::milliseconds(absl::ToInt64Milliseconds(options_.load_report_interval));
      if (load_reports_.Changed(engine_->load())) PublishStatus();
    }
    FlushReplies();  // last: a link's replies and published messages leave in one write
    if (drain_->ends()) {
      if (std::optional<Exit> exit = ContinueDrain(now)) return *exit;
    }
  }
}

void WorkerServer::MakeKvParts() {
  KVSERVE_CHECK_THREAD(loop_thread_);
  kv_links_ = std::make_unique<KvLinkTable>(
      options_.kv_links, engine_.get(), replies_.get(), metrics_.get(),
      [this](const std::string& router, uint32_t link_id) {
        KVSERVE_CHECK_THREAD(loop_thread_);  // links close on this thread
        layer_streams_->ForgetLink(router, link_id);
      });
  layer_streams_ = std::make_unique<LayerStreams>(engine_.get(), kv_links_.get(), replies_.get(),
                                                  metrics_.get());
  kv_transfers_ = std::make_unique<KvTransfers>(
      engine_.get(), kv_links_.get(), layer_streams_.get(), replies_.get(), metrics_.get());
}

absl::Status WorkerServer::ReceiveMessages() {
  KVSERVE_CHECK_THREAD(loop_thread_);
  std::vector<zmq::pollitem_t> items = {{router_->handle(), 0, ZMQ_POLLIN, 0}};
  if (links_) links_->AddPollItems(items);
  try {
    // Replies that wait for a slow router are retried often (ZeroMQ cannot say when a peer's
    // queue has room).
    const bool transfers = kv_transfers_->exporting() || layer_streams_->waiting();
    const bool unread = links_ && links_->has_unread();
    const int wait_ms = engine_->HasWork() || unread           ? 0
                        : replies_->waiting() > 0 || transfers ? 1
                                                               : 10;
    zmq::poll(items.data(), items.size(), std::chrono::milliseconds(wait_ms));
  } catch (const zmq::error_t& e) {
    if (e.num() != EINTR) return absl::InternalError(absl::StrCat("zmq poll: ", e.what()));
  }
  if (links_) {
    std::vector<ReceivedMessage> in;
    std::vector<std::string> closed;
    links_->Poll(in, 256, closed);
    for (const ReceivedMessage& m : in) HandleMessage(m);
    for (const std::string& peer : closed) AbortRequestsOf(peer);
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

void WorkerServer::MeasurePrefill(int64_t prompt_tokens, double seconds) {
  KVSERVE_CHECK_THREAD(loop_thread_);
  // A step with a few prompt tokens is bound by reading the weights, not by compute: only steps
  // with two blocks' worth of prompt or more say how fast this worker prefills (the decode rows
  // that share the step make the figure lower: on the side of not fetching).
  constexpr int64_t kPrefillStepTokens = 32;
  if (prompt_tokens < kPrefillStepTokens || seconds <= 0) return;
  const double rate = static_cast<double>(prompt_tokens) / seconds;
  prefill_tokens_per_second_ =
      prefill_tokens_per_second_ == 0 ? rate : 0.8 * prefill_tokens_per_second_ + 0.2 * rate;
}

absl::Status WorkerServer::StepEngine() {
  KVSERVE_CHECK_THREAD(loop_thread_);
  const int64_t computed_before = engine_->computed_tokens();
  const int64_t prompt_before = engine_->computed_prompt_tokens();
  const auto step_start = Clock::now();
  const absl::Status stepped_ok = engine_->StepInto(step_outputs_);
  // (A step that ran nothing through the model, as the sim device's wait for its step time,
  // is not an iteration.)
  if (engine_->computed_tokens() > computed_before) {
    // vLLM's iteration tokens: the prompt tokens the step computed and the tokens it generated
    // (a request of P prompt tokens and N outputs counts P + N over its steps).
    const int64_t prompt = engine_->computed_prompt_tokens() - prompt_before;
    int64_t generated = 0;
    for (const SequenceOutput& out : step_outputs_) {
      generated += static_cast<int64_t>(out.new_tokens.size());
    }
    metrics_->ObserveStepTokens(prompt + generated);
    MeasurePrefill(prompt, Seconds(Clock::now() - step_start));
  }
  if (!stepped_ok.ok()) {
    state_ = pb::WORKER_STATE_STOPPING;
    for (auto& [id, route] : routes_) SendError(route.identity, id, stepped_ok, ++route.seq);
    PublishStatus();
    return stepped_ok;
  }
  const auto stepped = Clock::now();
  for (auto& [id, route] : routes_) {  // queue time ends at the first scheduling
    if (route.scheduled == Clock::time_point() && engine_->Started(id)) route.scheduled = stepped;
  }
  SendOutputs(step_outputs_);
  return absl::OkStatus();
}

}  // namespace kvserve::worker
