// WorkerServer: liveness. Every heartbeat refreshes the metrics and publishes a WorkerStatus
// (state, block counts, load, cache key parts, recycle hold), and asks for a recycle slot while
// one is due.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/net/curve.h"
#include "glog/logging.h"
#include "worker/server/process_clock.h"
#include "worker/server/worker_server.h"

namespace kvserve::worker {

namespace pb = ::kvserve::v1;

namespace {

// WorkerStatus.metrics_endpoint: ":port" where the router reaches the worker's other sockets
// (the metrics bound there, on every address, or on loopback, where only a router on this host
// reads them), "host:port" when they are bound to an address of their own.
std::string MetricsEndpoint(const WorkerServerOptions& o, int port) {
  const std::string& h = o.metrics_host;
  const bool own = !h.empty() && h != o.host && h != "0.0.0.0" && h != "::" && !IsLoopbackHost(h);
  const bool v6 = h.find(':') != std::string::npos;
  return own ? absl::StrCat(v6 ? "[" : "", h, v6 ? "]:" : ":", port) : absl::StrCat(":", port);
}

}  // namespace

void WorkerServer::Heartbeat(Clock::time_point now) {
  KVSERVE_CHECK_THREAD(loop_thread_);
  UpdateMetrics();
  PublishStatus();
  next_heartbeat_ = now + std::chrono::milliseconds(absl::ToInt64Milliseconds(options_.heartbeat));
  // Ask for a recycle slot, and keep asking every heartbeat until granted: PUB drops messages
  // for subscribers that are not connected yet, and a denied ask is retried.
  std::string reason;
  if (drain_->draining() || !RecycleDue(&reason)) return;
  pb::Control ask;
  ask.set_action(pb::CONTROL_ACTION_RECYCLE_REQUEST);
  ask.set_reason(reason);
  ask.set_instance_id(instance_id_);
  Publish("control", ask);
  if (drain_->AskRecycle()) LOG(INFO) << "asking for a recycle slot: " << reason;
}

void WorkerServer::Publish(const std::string& topic, const google::protobuf::Message& m) {
  KVSERVE_CHECK_THREAD(loop_thread_);
  absl::Status s = publisher_->Publish(topic, m);
  if (!s.ok()) LOG(WARNING) << "publish " << topic << ": " << s;
}

void WorkerServer::PublishStatus() {
  KVSERVE_CHECK_THREAD(loop_thread_);
  const EngineStats s = engine_->stats();
  pb::WorkerStatus st;
  st.set_worker_id(options_.worker_id);
  st.set_instance_id(instance_id_);
  st.set_state(static_cast<pb::WorkerState>(state_.load()));
  if (const std::optional<Drain::HeldGrant> grant = drain_->held(Clock::now())) {
    st.set_recycle_pending(true);
    st.set_recycle_grant_ms(grant->granted_ms);
    st.set_recycle_granted_by(grant->by);
  }
  load_reports_.Fill(engine_->load(), st.mutable_load_report());
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
  st.set_kv_event_seq(kv_events_->seq());
  st.set_block_size(engine_->config().cache.block_size);
  st.set_timestamp_ms(NowMs());
  st.set_model_id(engine_->config().model_id);
  st.set_kv_cache_dtype(engine_->kv_spec().CacheKeyDType());
  st.set_kv_quant(engine_->kv_spec().CacheKeyQuant());
  st.set_tensor_parallel_size(engine_->config().parallel.tensor_parallel_size);
  st.set_max_num_seqs(engine_->config().scheduler.max_num_seqs);
  st.set_http_endpoint(options_.http_endpoint);
  if (options_.vllm_metric_names) st.set_metrics_endpoint(MetricsEndpoint(options_, http_->port()));
  st.set_kv_wire_block_bytes(engine_->KvWireBlockBytes());
  st.set_link_port(link_port());
  st.set_prefill_tokens_per_second(prefill_tokens_per_second_);
  st.set_role(options_.role);
  st.set_kv_link(options_.kv_links.kind);
  Publish("status", st);
}

void WorkerServer::UpdateMetrics(bool refresh_kv_usage) {
  KVSERVE_CHECK_THREAD(loop_thread_);
  if (refresh_kv_usage) kv_usage_ = engine_->kv_usage();
  if (zap_) metrics_->UpdateAuthentications(zap_->accepted(), zap_->refused());
  if (const VllmEventPublisher* vllm = kv_events_->vllm()) {
    metrics_->UpdateVllmEvents(vllm->published(), vllm->dropped());
  }
  metrics_->UpdateReplies(replies_->waiting(), replies_->waited(), replies_->dropped());
  metrics_->Update(engine_->stats(), kv_usage_.allocated_slots, kv_usage_.used_tokens,
                   drain_->draining(), Seconds(Clock::now() - started_), kv_events_->seq());
}

}  // namespace kvserve::worker
