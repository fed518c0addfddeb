// A worker's device-to-device KV links (docs/DISAGGREGATION.md), by the router that opened them
// and its id (routers number their own). A router's KvLinkOpen makes (rank 0: a fresh id,
// answered at once) and joins a link on a thread of its own, since joining waits for the peer;
// PollJoins answers each finished join with a KvLinkStatus. A link that fails in a transfer is
// dropped (Drop) and the router told; KvLinkClose drops one on the router's word.
//
// The worker loop's (WorkerServer owns it there, between engine steps), but for the join
// threads, each of which writes only its own join's result, under that join's mutex.
//
//   KvLinkTable links(maker, engine, replies, metrics, on_close);
//   links.OnMessage(m);                                // KvLinkOpen / KvLinkClose
//   links.PollJoins();                                 // each turn
//   if (KvLink* link = links.Find(router, id)) ...     // a transfer's link
#ifndef KVSERVE_WORKER_SERVER_KV_LINK_TABLE_H_
#define KVSERVE_WORKER_SERVER_KV_LINK_TABLE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/net/zmq_framing.h"
#include "kvserve/v1/kvserve.pb.h"
#include "worker/engine.h"
#include "worker/kv_link_maker.h"
#include "worker/server/reply_queue.h"
#include "worker/server/worker_metrics.h"

namespace kvserve::worker {

class KvLinkTable {
 public:
  // Called as a link closes, before it goes: what waits for it is dropped.
  using OnClose = std::function<void(const std::string& router, uint32_t link_id)>;

  // `engine`, `replies` and `metrics` are the server's and outlive this.
  KvLinkTable(KvLinkMaker maker, Engine* engine, ReplyQueue* replies, WorkerMetrics* metrics,
              OnClose on_close)
      : maker_(std::move(maker)),
        engine_(engine),
        replies_(replies),
        metrics_(metrics),
        on_close_(std::move(on_close)) {}

  // A KvLinkOpen or KvLinkClose from router `m.prefix`.
  void OnMessage(const ReceivedMessage& m);
  // Answers the joins that finished: the link is open, or why not.
  void PollJoins();
  // The open link, or null.
  [[nodiscard]] KvLink* Find(const std::string& router, uint32_t link_id);
  // Closes a link that failed, telling its router why in a KvLinkStatus.
  void Drop(const std::string& router, uint32_t link_id, const absl::Status& why);

 private:
  // A link being joined on its own thread (KvLinkMaker::join blocks until the peer comes).
  struct Join {
    ~Join() {
      if (thread.joinable()) thread.join();
    }
    uint32_t link_id = 0;
    std::string router;   // the identity that opened it
    bool closed = false;  // KvLinkClose came first: the link is dropped once joined
    absl::Mutex mu;
    bool done ABSL_GUARDED_BY(mu) = false;
    absl::StatusOr<KvLink> result ABSL_GUARDED_BY(mu);
    std::thread thread;  // writes result and done, once
  };

  void Open(const ReceivedMessage& m);
  // Why `open` cannot be served here (OK: it can).
  absl::Status Refusal(const std::string& router, const kvserve::v1::KvLinkOpen& open) const;
  // Closes a link: the engine's streams on it and what waits for it first.
  void Erase(const std::string& router, uint32_t link_id);

  const KvLinkMaker maker_;
  Engine* const engine_;
  ReplyQueue* const replies_;
  WorkerMetrics* const metrics_;
  const OnClose on_close_;
  absl::flat_hash_map<std::pair<std::string, uint32_t>, KvLink> links_;
  std::vector<std::unique_ptr<Join>> joins_;
};

}  // namespace kvserve::worker

#endif  // KVSERVE_WORKER_SERVER_KV_LINK_TABLE_H_
