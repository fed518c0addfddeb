// The simulator's part that stands for a worker server's KV-event publishing (simulator.h).
#ifndef KVSERVE_TOOLS_ROUTE_SIM_EVENT_BUFFER_H_
#define KVSERVE_TOOLS_ROUTE_SIM_EVENT_BUFFER_H_

#include <cstdint>
#include <optional>
#include <utility>

#include "common/kv/block_hash.h"
#include "kvserve/v1/kvserve.pb.h"
#include "worker/engine.h"
#include "worker/server/kv_event_batch.h"

namespace kvserve::route_sim {

// A worker's KV events, batched per step as the worker server batches them per loop turn
// (grouped the same way: kv_event_batch.h).
class EventBuffer : public worker::KvEventListener {
 public:
  void OnKvEvent(const BlockHash& hash, bool stored, worker::Medium medium,
                 const worker::BlockContent* /*content*/) override {
    worker::AddBlockChange(
        *batch_.mutable_events(), hash, stored,
        medium == worker::Medium::kHost ? kvserve::v1::MEDIUM_HOST : kvserve::v1::MEDIUM_DEVICE);
  }
  // The events since the last call as the next batch of instance `instance`; none: empty.
  std::optional<kvserve::v1::KvEventBatch> Take(uint64_t instance) {
    if (batch_.events_size() == 0) return std::nullopt;
    kvserve::v1::KvEventBatch out = std::move(batch_);
    batch_.Clear();
    out.set_instance_id(instance);
    out.set_seq(++seq_);
    return out;
  }

 private:
  kvserve::v1::KvEventBatch batch_;
  uint64_t seq_ = 0;
};

}  // namespace kvserve::route_sim

#endif  // KVSERVE_TOOLS_ROUTE_SIM_EVENT_BUFFER_H_
