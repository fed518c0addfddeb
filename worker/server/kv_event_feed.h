// A worker's KV events on its PUB socket (topic "kv"; docs/ROUTER.md) and on framed links that
// subscribed (publisher.h). The engine's cache changes are queued as they happen (OnKvEvent) and
// published once a loop turn as one numbered KvEventBatch; a snapshot (on a router's request)
// and all-cleared (at start and exit) keep subscribers whole. With --kv-events-config the same
// changes go out in vLLM's format too, through the VllmEventPublisher it owns (its own thread).
//
// A part of the WorkerServer, which owns it on the loop thread (the engine's, which calls
// OnKvEvent back).
//
//   KvEventFeed feed({.worker_id = "w0", .instance_id = id}, &publisher, nullptr);
//   engine.SetKvEventListener(&feed);
//   feed.Publish();  // each loop turn
#ifndef KVSERVE_WORKER_SERVER_KV_EVENT_FEED_H_
#define KVSERVE_WORKER_SERVER_KV_EVENT_FEED_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/kv/vllm_kv_events.h"
#include "kvserve/v1/kvserve.pb.h"
#include "worker/engine.h"
#include "worker/kv_cache/kv_cache_manager.h"
#include "worker/server/publisher.h"
#include "worker/server/vllm_event_publisher.h"

namespace kvserve::worker {

class KvEventFeed : public KvEventListener {
 public:
  struct Options {
    std::string worker_id;
    uint64_t instance_id = 0;
    int block_size = 16;
    vllm_events::Encoding vllm_encoding = vllm_events::Encoding::kMap;
  };

  // `publisher` is the server's and outlives this (or its socket is closed after Close).
  // `vllm`: vLLM's publisher, or null for none.
  KvEventFeed(Options options, Publisher* publisher, std::unique_ptr<VllmEventPublisher> vllm)
      : options_(std::move(options)), publisher_(publisher), vllm_(std::move(vllm)) {}

  void OnKvEvent(const BlockHash& hash, bool stored, Medium medium,
                 const BlockContent* content) override;
  // The changes queued since the last call, as one batch (none: nothing is sent).
  void Publish();
  // Drops what is queued and publishes all-cleared: the worker holds nothing (as it starts,
  // and once drained).
  void PublishAllCleared();
  // The queued changes, then every block `engine` caches now, numbered as the last batch.
  void PublishSnapshot(const Engine& engine);
  // Stops vLLM's publisher (it sends what it holds; its sockets close before the context).
  void Close() { vllm_.reset(); }

  // The last batch's number (WorkerStatus.kv_event_seq), and vLLM's publisher (null: none).
  [[nodiscard]] uint64_t seq() const { return seq_; }
  [[nodiscard]] const VllmEventPublisher* vllm() const { return vllm_.get(); }

 private:
  void Send(const google::protobuf::Message& m);

  const Options options_;
  Publisher* const publisher_;
  std::unique_ptr<VllmEventPublisher> vllm_;
  google::protobuf::RepeatedPtrField<kvserve::v1::KvEvent> pending_;
  std::vector<vllm_events::Event> vllm_pending_;  // the same changes, vLLM's way
  uint64_t seq_ = 0;
};

}  // namespace kvserve::worker

#endif  // KVSERVE_WORKER_SERVER_KV_EVENT_FEED_H_
