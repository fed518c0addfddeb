// An OpenAI upstream as a kvserve worker (upstream_bridge.h).
#include "upstream/upstream_bridge.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/kv/block_hash.h"
#include "common/kv/vllm_kv_events.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "nlohmann/json.hpp"
#include "proto/worker_control.h"
#include "upstream/completion_wire.h"

namespace kvserve::upstream {

namespace pb = kvserve::v1;
namespace http = boost::beast::http;

// One request in flight: its thread streams from the upstream; the loop owns the rest.
struct UpstreamBridge::Call {
  std::string identity;
  pb::GenerateRequest request;
  HttpCancel cancel;
  std::thread thread;
  uint32_t seq = 0;
  bool aborted = false;  // answered already; what the thread still sends is dropped
  std::vector<pb::GenerateResponse> pending;  // a non-streamed request's deltas
};

namespace {

int64_t NowMs() { return absl::ToUnixMillis(absl::Now()); }

// Merges a non-streamed request's deltas into one per sample, the usage on the last.
std::vector<pb::GenerateResponse> Merge(const std::vector<pb::GenerateResponse>& deltas, int n) {
  std::vector<pb::GenerateResponse> by_sample(std::max(1, n));
  const pb::GenerateResponse* with_usage = nullptr;
  int last = 0;
  for (const pb::GenerateResponse& d : deltas) {
    const int i = std::clamp(d.sample_index(), 0, static_cast<int>(by_sample.size()) - 1);
    pb::GenerateResponse& acc = by_sample[i];
    acc.set_request_id(d.request_id());
    acc.set_sample_index(i);
    acc.mutable_token_ids()->MergeFrom(d.token_ids());
    acc.mutable_logprobs()->MergeFrom(d.logprobs());
    if (d.finish_reason() != pb::FINISH_REASON_UNSPECIFIED) {
      acc.set_finish_reason(d.finish_reason());
      if (d.has_stop_token_id()) acc.set_stop_token_id(d.stop_token_id());
    }
    if (d.has_usage()) with_usage = &d, last = i;
  }
  if (with_usage != nullptr) {
    *by_sample[last].mutable_usage() = with_usage->usage();
    std::swap(by_sample[last], by_sample.back());
  }
  return by_sample;
}

}  // namespace

UpstreamBridge::UpstreamBridge(UpstreamBridgeOptions options)
    : o_(std::move(options)), metrics_(o_.name) {}

absl::StatusOr<std::unique_ptr<UpstreamBridge>> UpstreamBridge::Create(
    UpstreamBridgeOptions options) {
  if (options.block_size < 0 || options.max_concurrency < 1) {
    return absl::InvalidArgumentError("block size must be >= 0 and max concurrency >= 1");
  }
  std::unique_ptr<UpstreamBridge> b(new UpstreamBridge(std::move(options)));
  b->model_ = b->o_.model;
  b->block_size_ = b->o_.block_size;
  b->instance_id_ = std::random_device()() | (uint64_t{std::random_device()()} << 32);
  for (zmq::socket_t* s : {&b->router_, &b->pub_}) s->set(zmq::sockopt::linger, 0);
  b->pub_.set(zmq::sockopt::sndhwm, 100000);
  if (!b->o_.curve_secret_key.empty()) {
    ASSIGN_OR_RETURN(b->zap_, ZapAuthenticator::Start(b->ctx_, b->o_.curve_allowed_clients_dir));
    RETURN_IF_ERROR(MakeCurveServer(b->router_, b->o_.curve_secret_key));
    RETURN_IF_ERROR(MakeCurveServer(b->pub_, b->o_.curve_secret_key));
  }
  ASSIGN_OR_RETURN(b->port_, BindTcp(b->router_, b->o_.host, b->o_.port, "--port"));
  ASSIGN_OR_RETURN(b->events_port_,
                   BindTcp(b->pub_, b->o_.host, b->o_.events_port, "--events-port"));
  if (!b->o_.events_endpoint.empty()) {
    ASSIGN_OR_RETURN(std::vector<VllmEventEndpoints> ranks,
                     RankEndpoints({.events = b->o_.events_endpoint,
                                    .replay = b->o_.replay_endpoint,
                                    .bind = b->o_.events_bind},
                                   b->o_.data_parallel_size));
    for (size_t r = 0; r < ranks.size(); ++r) {
      ASSIGN_OR_RETURN(std::unique_ptr<VllmEventSource> source,
                       VllmEventSource::Open(b->ctx_, ranks[r], b->o_.topic, static_cast<int>(r)));
      b->sources_.push_back(std::move(source));
    }
  }
  b->wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (b->wake_fd_ < 0) return absl::InternalError("eventfd failed");
  return b;
}

UpstreamBridge::~UpstreamBridge() {
  for (auto& [id, call] : calls_) {
    call->cancel.Cancel();
    if (call->thread.joinable()) call->thread.join();
  }
  if (wake_fd_ >= 0) close(wake_fd_);
}

void UpstreamBridge::Post(Handoff h) {
  {
    absl::MutexLock lock(&mu_);
    handoffs_.push_back(std::move(h));
  }
  const uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
}

bool UpstreamBridge::ready() const {
  return !model_.empty() && block_size_ > 0 &&
         absl::Now() - last_scrape_ok_ < 3 * o_.scrape + absl::Seconds(2);
}

absl::Status UpstreamBridge::Run(const std::atomic<bool>* stop) {
  std::thread scraper([this, stop] { Scrape(stop); });
  absl::Time next_heartbeat = absl::Now();
  while (!stop->load()) {
    std::vector<zmq::pollitem_t> items = {{router_.handle(), 0, ZMQ_POLLIN, 0},
                                          {nullptr, wake_fd_, ZMQ_POLLIN, 0}};
    for (auto& source : sources_) source->AddPollItems(items);
    try {
      zmq::poll(items.data(), items.size(), std::chrono::milliseconds(50));
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR) return absl::InternalError(absl::StrCat("poll: ", e.what()));
    }
    if (items[1].revents & ZMQ_POLLIN) {
      uint64_t n;
      (void)!read(wake_fd_, &n, sizeof(n));
    }
    TakeHandoffs();
    for (;;) {
      absl::StatusOr<std::optional<ReceivedMessage>> m =
          ReceiveMessage(router_, /*with_prefix=*/true, zmq::recv_flags::dontwait);
      if (!m.ok()) continue;  // malformed: dropped
      if (!m->has_value()) break;
      HandleMessage(**m);
    }
    ReadEvents();
    if (absl::Now() >= next_heartbeat) {
      PublishStatus();
      next_heartbeat = absl::Now() + o_.heartbeat;
    }
  }
  scraper.join();
  for (auto& [id, call] : calls_) call->cancel.Cancel();
  for (auto& [id, call] : calls_) {
    if (call->thread.joinable()) call->thread.join();
  }
  calls_.clear();
  return absl::OkStatus();
}

void UpstreamBridge::TakeHandoffs() {
  std::deque<Handoff> taken;
  {
    absl::MutexLock lock(&mu_);
    taken.swap(handoffs_);
  }
  for (Handoff& h : taken) {
    if (h.scrape) {
      if (!h.model.empty() && model_.empty()) model_ = h.model;
      OnScrape(*h.scrape);
      continue;
    }
    if (h.unreached && ready()) {  // out of the router's eligible set at once
      LOG(WARNING) << "upstream " << o_.name << " unreachable; not ready until a scrape succeeds";
      last_scrape_ok_ = absl::InfinitePast();
      PublishStatus();
    }
    auto it = calls_.find(h.request_id);
    if (it == calls_.end()) continue;
    SendDeltas(*it->second, h.deltas, h.done);
    if (h.done) {
      for (const pb::GenerateResponse& d : h.deltas) {
        if (d.finish_reason() != pb::FINISH_REASON_ERROR) continue;
        (h.unreached ? metrics_.unreached : metrics_.failed)->Increment();
      }
      if (it->second->thread.joinable()) it->second->thread.join();
      calls_.erase(it);
      metrics_.in_flight->Decrement();
    }
  }
}

void UpstreamBridge::Reply(const std::string& identity, const google::protobuf::Message& m) {
  if (absl::Status s = SendMessage(router_, identity, m, zmq::send_flags::dontwait); !s.ok()) {
    LOG_EVERY_T(WARNING, 10) << "upstream bridge reply: " << s;
  }
}

void UpstreamBridge::SendDeltas(Call& call, std::vector<pb::GenerateResponse>& deltas, bool done) {
  if (call.aborted) return;
  if (!call.request.stream()) {
    for (auto& d : deltas) {
      if (d.finish_reason() == pb::FINISH_REASON_ERROR) {  // an error ends it as it is
        call.pending.clear();
        d.set_seq(++call.seq);
        Reply(call.identity, d);
        return;
      }
      call.pending.push_back(std::move(d));
    }
    if (!done) return;
    for (pb::GenerateResponse& d : Merge(call.pending, call.request.sampling().n())) {
      d.set_seq(++call.seq);
      Reply(call.identity, d);
    }
    return;
  }
  for (pb::GenerateResponse& d : deltas) {
    d.set_seq(++call.seq);
    Reply(call.identity, d);
  }
}

void UpstreamBridge::HandleMessage(const ReceivedMessage& m) {
  if (m.type == "GenerateRequest") {
    pb::GenerateRequest req;
    if (!ParseMessage(m, &req).ok()) return;
    StartCall(m.prefix, req);
  } else if (m.type == "AbortRequest") {
    pb::AbortRequest req;
    if (!ParseMessage(m, &req).ok()) return;
    auto it = calls_.find(req.request_id());
    if (it == calls_.end() || it->second->aborted) return;
    Call& call = *it->second;
    call.cancel.Cancel();  // closing the stream is how vLLM and kvserve abort
    pb::GenerateResponse r;
    r.set_request_id(req.request_id());
    r.set_finish_reason(pb::FINISH_REASON_ABORT);
    r.mutable_error()->set_code(static_cast<int>(absl::StatusCode::kCancelled));
    r.mutable_error()->set_message(req.reason().empty() ? "aborted" : req.reason());
    r.set_seq(++call.seq);
    Reply(call.identity, r);
    call.aborted = true;
  } else if (m.type == "Control") {
    pb::Control c;
    if (ParseMessage(m, &c).ok()) HandleControl(m.prefix, c);
  }
}

void UpstreamBridge::StartCall(const std::string& identity, const pb::GenerateRequest& req) {
  auto refuse = [&](const absl::Status& s) {
    pb::GenerateResponse r;
    r.set_request_id(req.request_id());
    r.set_seq(1);
    r.set_finish_reason(pb::FINISH_REASON_ERROR);
    r.mutable_error()->set_code(static_cast<int>(s.code()));
    r.mutable_error()->set_message(std::string(s.message()));
    Reply(identity, r);
    metrics_.refused->Increment();
  };
  if (draining_) return refuse(absl::FailedPreconditionError("the upstream bridge is draining"));
  if (!ready()) {  // nothing ran: the router places it elsewhere
    return refuse(absl::FailedPreconditionError("the upstream is not ready"));
  }
  if (calls_.contains(req.request_id())) {
    return refuse(absl::AlreadyExistsError(
        absl::StrCat("request '", req.request_id(), "' is already running")));
  }
  absl::StatusOr<std::string> body = UpstreamCompletionBody(req, model_);
  if (!body.ok()) return refuse(body.status());
  metrics_.sent->Increment();
  metrics_.in_flight->Increment();
  auto call = std::make_unique<Call>();
  call->identity = identity;
  call->request = req;
  Call* c = call.get();
  calls_[req.request_id()] = std::move(call);
  c->thread = std::thread([this, c, body = *std::move(body)] {
    UpstreamStreamReader reader(c->request);
    std::string error_body;
    absl::Status broken;
    int status = 0;
    bool sent = false;
    absl::StatusOr<int> got =
        Exchange(o_.api, http::verb::post, "/v1/completions", body,
                 [&](std::string_view bytes) {
                   if (status != 200) {
                     error_body.append(bytes.substr(0, 4096));
                     return;
                   }
                   std::vector<pb::GenerateResponse> deltas;
                   if (absl::Status s = reader.Feed(bytes, &deltas); !s.ok() && broken.ok())
                     broken = s;
                   if (!deltas.empty()) Post({c->request.request_id(), std::move(deltas)});
                 },
                 {.cancel = &c->cancel,
                  .io_timeout_ms = 0,
                  .on_status = [&](int s) { status = s; },
                  .sent = &sent});
    std::vector<pb::GenerateResponse> last;
    if (!got.ok()) {
      if (got.status().code() != absl::StatusCode::kCancelled) broken = got.status();
    } else if (*got != 200) {
      last.push_back(UpstreamRefusal(c->request.request_id(), *got, error_body));
    } else if (broken.ok() && !reader.finished()) {
      broken = reader.Finish(&last);
    }
    // Never reached the upstream (refused, reset while writing): nothing ran, so the router may
    // place it elsewhere (FailedPrecondition), and the upstream is out of reach until a scrape
    // says otherwise.
    const bool unreached =
        !got.ok() && !sent && got.status().code() != absl::StatusCode::kCancelled;
    if (!broken.ok() && last.empty()) {
      pb::GenerateResponse e;
      e.set_request_id(c->request.request_id());
      e.set_finish_reason(pb::FINISH_REASON_ERROR);
      e.mutable_error()->set_code(static_cast<int>(unreached ? absl::StatusCode::kFailedPrecondition
                                                             : absl::StatusCode::kUnavailable));
      e.mutable_error()->set_message(absl::StrCat(
          "upstream: ", broken.message(), unreached ? " (the request never reached it)" : ""));
      last.push_back(std::move(e));
    }
    Post({.request_id = c->request.request_id(),
          .deltas = std::move(last),
          .done = true,
          .unreached = unreached});
  });
}

void UpstreamBridge::HandleControl(const std::string& identity, const pb::Control& c) {
  const auto set_draining = [this](bool draining) {
    return [this, draining](const pb::Control&) {
      draining_ = draining;
      return absl::OkStatus();
    };
  };
  Reply(identity, AnswerControl(c,
                                {{pb::CONTROL_ACTION_DRAIN, set_draining(true)},
                                 {pb::CONTROL_ACTION_UNDRAIN, set_draining(false)},
                                 {pb::CONTROL_ACTION_SNAPSHOT_REQUEST,
                                  [this](const pb::Control&) {
                                    PublishSnapshot();
                                    return absl::OkStatus();
                                  }}},
                                [](pb::ControlAction action) {
                                  return absl::UnimplementedError(absl::StrCat(
                                      "an OpenAI upstream takes no control action ", action,
                                      " (kvserve neither recycles nor restarts it)"));
                                }));
  if (c.action() == pb::CONTROL_ACTION_DRAIN || c.action() == pb::CONTROL_ACTION_UNDRAIN) {
    PublishStatus();
  }
}

void UpstreamBridge::PublishStatus() {
  metrics_.ready->Set(ready() && !draining_ ? 1 : 0);
  pb::WorkerStatus st;
  st.set_worker_id(o_.name);
  st.set_instance_id(instance_id_);
  st.set_state(draining_ ? pb::WORKER_STATE_DRAINING
               : ready() ? pb::WORKER_STATE_READY
                         : pb::WORKER_STATE_STARTING);
  const UpstreamLoad l = load_.value_or(UpstreamLoad());
  const int64_t total = l.num_gpu_blocks.value_or(0);
  const int64_t active = static_cast<int64_t>(l.kv_usage.value_or(0) * total + 0.5);
  pb::BlockCounts* b = st.add_blocks();
  b->set_medium(pb::MEDIUM_DEVICE);
  b->set_total(total);
  b->set_active(active);
  b->set_free(total - active);
  st.set_num_running(static_cast<int>(l.running.value_or(calls_.size())));
  st.set_num_waiting(static_cast<int>(l.waiting.value_or(0)));
  st.set_load(l.kv_usage.value_or(0) + l.waiting.value_or(0) / o_.max_concurrency);
  st.set_kv_event_seq(kv_seq_);
  st.set_block_size(block_size_);
  st.set_timestamp_ms(NowMs());
  st.set_model_id(model_);
  st.set_kv_cache_dtype(l.cache_dtype.value_or("auto"));
  st.set_tensor_parallel_size(1);
  st.set_max_num_seqs(o_.max_concurrency);
  // The upstream on this host (a sidecar, a test) is reached at the bridge's own address.
  st.set_http_endpoint(IsLoopbackHost(o_.api.host) ? absl::StrCat(":", o_.api.port)
                                                   : absl::StrCat(o_.api.host, ":", o_.api.port));
  st.set_metrics_endpoint(st.http_endpoint());  // vLLM serves /metrics on its API port
  if (absl::Status s = SendMessage(pub_, "status", st, zmq::send_flags::dontwait); !s.ok()) {
    LOG_EVERY_T(WARNING, 10) << "upstream bridge heartbeat: " << s;
  }
}

void UpstreamBridge::PublishSnapshot() {
  pb::KvSnapshot snap;
  snap.set_worker_id(o_.name);
  snap.set_instance_id(instance_id_);
  snap.set_seq(kv_seq_);
  if (translator_) {
    for (pb::CachedBlock& c : translator_->Snapshot()) *snap.add_blocks() = std::move(c);
  }
  (void)SendMessage(pub_, "kv", snap, zmq::send_flags::dontwait);
}

void UpstreamBridge::OnScrape(const absl::StatusOr<UpstreamLoad>& load) {
  if (!load.ok()) {
    metrics_.scrapes_failed->Increment();
    LOG_EVERY_T(WARNING, 10) << "upstream " << o_.name << " /metrics: " << load.status();
    return;
  }
  metrics_.scrapes_ok->Increment();
  if (load->start_time) {
    // (A restart its event stream showed first is not forgotten twice.)
    if (upstream_started_ && *load->start_time != *upstream_started_ && !restart_in_stream_) {
      ForgetUpstreamCache("its process start time changed");
    }
    upstream_started_ = load->start_time;
  }
  restart_in_stream_ = false;
  load_ = *load;
  last_scrape_ok_ = absl::Now();
  if (block_size_ == 0 && load->block_size) block_size_ = *load->block_size;
  if (!translator_ && block_size_ > 0 && !model_.empty()) {
    absl::StatusOr<std::string> extra = CacheKey{model_, load->cache_dtype.value_or("auto"),
                                                 "",     static_cast<uint32_t>(block_size_),
                                                 1,      ""}
                                            .Serialize();
    if (!extra.ok()) return;
    translator_.emplace(*extra, block_size_);
    AskReplays();  // what the engines cached before this bridge listened
  }
}

void UpstreamBridge::ForgetUpstreamCache(std::string_view why) {
  if (!translator_) return;
  LOG(WARNING) << "upstream " << o_.name << " restarted (" << why << "): its cache is forgotten";
  metrics_.restarts->Increment();
  std::vector<vllm_events::Event> clear(1);
  clear[0].kind = vllm_events::Event::Kind::kAllCleared;
  std::vector<pb::KvEvent> cleared = translator_->Translate(clear);
  PublishEvents(cleared, NowMs());
  AskReplays();  // the new process's streams, from their start
}

void UpstreamBridge::AskReplays() {
  for (auto& source : sources_) source->AskReplay(0, metrics_);
}

void UpstreamBridge::ApplyVllmBatch(uint64_t seq, std::string_view payload) {
  absl::StatusOr<vllm_events::Batch> batch = vllm_events::Decode(payload);
  if (!batch.ok()) {
    metrics_.batches_undecodable->Increment();
    LOG_EVERY_T(WARNING, 10) << "upstream " << o_.name << " event batch " << seq << ": "
                             << batch.status();
    return;
  }
  std::vector<pb::KvEvent> events = translator_->Translate(batch->events);
  const VllmEventTranslator::Counters& c = translator_->counters();
  metrics_.orphans->Increment(static_cast<double>(c.orphans - skipped_.orphans));
  metrics_.wrong_size->Increment(static_cast<double>(c.wrong_size - skipped_.wrong_size));
  skipped_ = c;
  metrics_.indexed_blocks->Set(static_cast<double>(translator_->size()));
  metrics_.batches_applied->Increment();
  PublishEvents(events, static_cast<int64_t>(batch->ts * 1000));
}

void UpstreamBridge::PublishEvents(std::vector<pb::KvEvent>& events, int64_t timestamp_ms) {
  if (events.empty()) return;
  pb::KvEventBatch out;
  out.set_worker_id(o_.name);
  out.set_instance_id(instance_id_);
  out.set_seq(++kv_seq_);
  out.set_timestamp_ms(timestamp_ms);
  for (pb::KvEvent& e : events) *out.add_events() = std::move(e);
  (void)SendMessage(pub_, "kv", out, zmq::send_flags::dontwait);
}

void UpstreamBridge::ReadEvents() {
  const VllmEventSource::Callbacks callbacks = {
      // Until the first scrape made the translator, batches are dropped: it then replays them.
      .batch =
          [this](uint64_t seq, std::string_view payload) {
            if (translator_) ApplyVllmBatch(seq, payload);
          },
      .restart =
          [this] {
            ForgetUpstreamCache("its event stream started again");
            restart_in_stream_ = true;
          },
  };
  for (auto& source : sources_) source->Read(callbacks, metrics_);
}

void UpstreamBridge::Scrape(const std::atomic<bool>* stop) {
  bool have_model = !o_.model.empty();
  while (!stop->load()) {
    Handoff h;
    if (!have_model) {
      absl::StatusOr<std::string> models =
          Fetch(o_.api, http::verb::get, "/v1/models", "", {.io_timeout_ms = o_.http_timeout_ms});
      if (models.ok()) {
        const nlohmann::json j = nlohmann::json::parse(*models, nullptr, false);
        if (j.is_object() && j.value("data", nlohmann::json()).is_array() && !j["data"].empty() &&
            j["data"][0].value("id", nlohmann::json()).is_string()) {
          h.model = j["data"][0]["id"].get<std::string>();
          have_model = true;
        }
      }
    }
    absl::StatusOr<std::string> text =
        Fetch(o_.api, http::verb::get, "/metrics", "",
              {.io_timeout_ms = o_.http_timeout_ms, .max_body_bytes = 32 << 20});
    if (text.ok()) {
      absl::StatusOr<std::vector<Sample>> samples = ParsePrometheusText(*text);
      h.scrape = samples.ok() ? absl::StatusOr<UpstreamLoad>(VllmLoad(*samples))
                              : absl::StatusOr<UpstreamLoad>(samples.status());
    } else {
      h.scrape = text.status();
    }
    Post(std::move(h));
    const absl::Time until = absl::Now() + o_.scrape;
    while (!stop->load() && absl::Now() < until) absl::SleepFor(absl::Milliseconds(20));
  }
}

}  // namespace kvserve::upstream
