// WorkerServer: KV events on the PUB socket (topic "kv"). The engine's cache changes are queued
// as they happen (OnKvEvent) and published once a loop turn as one numbered KvEventBatch; a
// snapshot (on a router's request) and all-cleared (at start and exit) keep subscribers whole.
#include "glog/logging.h"
#include "worker/server/process_clock.h"
#include "worker/server/wire.h"
#include "worker/server/worker_server.h"

namespace kvserve::worker {

namespace pb = ::kvserve::v1;

void WorkerServer::OnKvEvent(const BlockHash& hash, bool stored, Medium medium) {
  KVSERVE_CHECK_THREAD(loop_thread_);
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
