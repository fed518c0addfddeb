// WorkerServer: KV events on the PUB socket (topic "kv"). The engine's cache changes are queued
// as they happen (OnKvEvent) and published once a loop turn as one numbered KvEventBatch; a
// snapshot (on a router's request) and all-cleared (at start and exit) keep subscribers whole.
// With --kv-events-config the same changes go out in vLLM's format too (vllm_event_publisher.h).
#include "glog/logging.h"
#include "worker/server/process_clock.h"
#include "worker/server/wire.h"
#include "worker/server/worker_server.h"

namespace kvserve::worker {

namespace pb = ::kvserve::v1;

void WorkerServer::OnKvEvent(const BlockHash& hash, bool stored, Medium medium,
                             const BlockContent* content) {
  KVSERVE_CHECK_THREAD(loop_thread_);
  if (vllm_publisher_ != nullptr) {
    // vLLM's media: its GPU pool and its CPU offload tier.
    const std::string_view tier = medium == Medium::kDevice ? "GPU" : "CPU";
    if (!stored) {
      vllm_events::AddRemovedBlock(vllm_pending_, hash, tier);
    } else if (content != nullptr) {
      vllm_events::AddStoredBlock(vllm_pending_, hash, content->parent, content->tokens,
                                  engine_->config().cache.block_size, tier);
    }
  }
  pb::KvEvent e;
  const auto fill = [&](auto* change) {
    change->add_block_hashes(hash.ToBytes());
    change->set_medium(ToWire(medium));
  };
  if (stored) {
    fill(e.mutable_stored());
  } else {
    fill(e.mutable_removed());
  }
  pending_events_.push_back(std::move(e));
}

void WorkerServer::Publish(const std::string& topic, const google::protobuf::Message& m) {
  KVSERVE_CHECK_THREAD(loop_thread_);
  absl::Status s = SendMessage(*pub_, topic, m, zmq::send_flags::dontwait);
  if (!s.ok()) LOG(WARNING) << "publish " << topic << ": " << s;
}

void WorkerServer::PublishEvents() {
  KVSERVE_CHECK_THREAD(loop_thread_);
  if (vllm_publisher_ != nullptr && !vllm_pending_.empty()) {
    vllm_events::Batch batch;
    batch.ts = static_cast<double>(NowMs()) / 1000.0;
    batch.events = std::move(vllm_pending_);
    vllm_pending_.clear();
    vllm_publisher_->Publish(vllm_events::Encode(batch, options_.vllm_events_encoding));
  }
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
  KVSERVE_CHECK_THREAD(loop_thread_);
  pending_events_.clear();
  vllm_pending_.clear();
  vllm_pending_.push_back({.kind = vllm_events::Event::Kind::kAllCleared});
  pb::KvEvent e;
  e.mutable_all_cleared();
  pending_events_.push_back(std::move(e));
  PublishEvents();
}

void WorkerServer::PublishSnapshot() {
  KVSERVE_CHECK_THREAD(loop_thread_);
  PublishEvents();  // the snapshot is valid after every event so far
  pb::KvSnapshot snap;
  snap.set_worker_id(options_.worker_id);
  snap.set_instance_id(instance_id_);
  snap.set_seq(event_seq_);
  engine_->ForEachCachedBlock([&](const BlockHash& h, Medium m) {
    pb::CachedBlock* b = snap.add_blocks();
    b->set_block_hash(h.ToBytes());
    b->set_medium(ToWire(m));
  });
  Publish("kv", snap);
}

}  // namespace kvserve::worker
