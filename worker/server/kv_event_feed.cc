#include "worker/server/kv_event_feed.h"

#include "glog/logging.h"
#include "worker/server/kv_event_batch.h"
#include "worker/server/process_clock.h"
#include "worker/server/wire.h"

namespace kvserve::worker {

namespace pb = ::kvserve::v1;

void KvEventFeed::OnKvEvent(const BlockHash& hash, bool stored, Medium medium,
                            const BlockContent* content) {
  if (vllm_ != nullptr) {
    // vLLM's media: its GPU pool and its CPU offload tier.
    const std::string_view tier = medium == Medium::kDevice ? "GPU" : "CPU";
    if (!stored) {
      vllm_events::AddRemovedBlock(vllm_pending_, hash, tier);
    } else if (content != nullptr) {
      vllm_events::AddStoredBlock(vllm_pending_, hash, content->parent, content->tokens,
                                  options_.block_size, tier);
    }
  }
  AddBlockChange(pending_, hash, stored, ToWire(medium));
}

void KvEventFeed::Send(const google::protobuf::Message& m) {
  absl::Status s = publisher_->Publish("kv", m);
  if (!s.ok()) LOG(WARNING) << "publish kv: " << s;
}

void KvEventFeed::Publish() {
  if (vllm_ != nullptr && !vllm_pending_.empty()) {
    vllm_events::Batch batch;
    batch.ts = static_cast<double>(NowMs()) / 1000.0;
    batch.events = std::move(vllm_pending_);
    vllm_pending_.clear();
    vllm_->Publish(vllm_events::Encode(batch, options_.vllm_encoding));
  }
  if (pending_.empty()) return;
  pb::KvEventBatch batch;
  batch.set_worker_id(options_.worker_id);
  batch.set_instance_id(options_.instance_id);
  batch.set_seq(++seq_);
  batch.set_timestamp_ms(NowMs());
  batch.mutable_events()->Swap(&pending_);
  pending_.Clear();
  Send(batch);
}

void KvEventFeed::PublishAllCleared() {
  pending_.Clear();
  vllm_pending_.clear();
  vllm_pending_.push_back({.kind = vllm_events::Event::Kind::kAllCleared});
  pending_.Add()->mutable_all_cleared();
  Publish();
}

void KvEventFeed::PublishSnapshot(const Engine& engine) {
  Publish();  // the snapshot is valid after every event so far
  pb::KvSnapshot snap;
  snap.set_worker_id(options_.worker_id);
  snap.set_instance_id(options_.instance_id);
  snap.set_seq(seq_);
  engine.ForEachCachedBlock([&](const BlockHash& h, Medium m) {
    pb::CachedBlock* b = snap.add_blocks();
    b->set_block_hash(h.ToBytes());
    b->set_medium(ToWire(m));
  });
  Send(snap);
}

}  // namespace kvserve::worker
