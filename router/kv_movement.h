// KV that moves between workers for the requests the router places (docs/DISAGGREGATION.md).
// - Peer prefix fetch (router/kv_fetch.h): a request routed to a worker that lacks a prefix a
//   peer caches further waits, placed but not sent, while its worker pulls the blocks; it is
//   sent when the fetch ends, whether the blocks came or not.
// - Disaggregated serving: a long prompt's prefill runs first on a prefill worker as a request
//   of its own (one greedy token, discarded); its decode worker then pulls the blocks as a peer
//   fetch, and the request itself goes to the decode worker, which prefills only the prompt's
//   last partial block and generates every token, as it would have alone. With an idle link
//   between the two (and --kv-link-stream-layers), the prefill worker streams the blocks over it
//   layer by layer as the phase computes them, and the request goes once that stream ended.
//
// Not thread-safe: RouterCore owns it on the core thread. It owns the fetches in flight, the
// device-to-device links (--kv-links) and the prefill phases that ended; the request's waits
// are on its Books entry (Placed::fetch, prefill, prefill_first).
//
//   KvMovement::Wait wait = kv.Start(job, views, hashes, worker);  // after routing
//   if (!wait.any()) Send(job);                                    // else it waits, on the books
//   kv.OnMessage(w, m);                                            // each message Poll returns
//   for (KvMovement::Unsent& u : kv.SendReady(views)) Move(u);     // each turn
#ifndef KVSERVE_ROUTER_KV_MOVEMENT_H_
#define KVSERVE_ROUTER_KV_MOVEMENT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/kv/block_hash.h"
#include "frontend/core/core.h"
#include "router/books.h"
#include "router/kv_fetch.h"
#include "router/kv_links.h"
#include "router/routing/prefix_index.h"
#include "router/routing/routing_policy.h"
#include "router/worker_pool.h"

namespace kvserve::router {

class RouterMetrics;

class KvMovement {
 public:
  struct Options {
    KvFetchConfig kv_fetch;
    // A request whose decode worker would prefill more than this many tokens is prefilled on a
    // prefill worker first (RouterOptions::max_local_prefill_tokens).
    int64_t max_local_prefill_tokens = 1000;
    RouterMetrics* metrics = nullptr;  // optional; outlives this
  };
  // What a request routed to a worker waits for before it is sent there.
  struct Wait {
    uint64_t fetch = 0;     // a fetch (or the stream of its prefill phase) in flight
    std::string prefill;    // its prefill phase's request id
    int prefill_first = 0;  // the first block its worker lacks, which the fetch starts from
    [[nodiscard]] bool any() const { return fetch != 0 || !prefill.empty(); }
  };
  // A request whose wait ended but which could not be sent: taken off the books, for the caller
  // to place again or fail.
  struct Unsent {
    std::string request_id;
    Placed placed;
    std::string why;
  };

  // `pool`, `index`, `books` and `policy` are the core's and outlive this.
  KvMovement(const Options& options, WorkerPool* pool, PrefixIndex* index, Books* books,
             RoutingPolicy* policy);

  // For `job`, just routed to worker `to`: starts its prefill phase on a prefill worker (when
  // its decode worker would prefill more than max_local_prefill_tokens and a prefill worker of
  // its KV shape is ready; the phase goes on the books) or else a fetch of its prefix from a
  // peer (when PlanFetch finds one worth it), and updates its predicted cached tokens. Returns
  // what the request waits for; nothing: send it now.
  Wait Start(frontend::Job& job, const std::vector<WorkerView>& views,
             const std::vector<BlockHash>& hashes, int to);
  // A message Poll returned: the KV side's (KvChunk, KvChunkAck, KvLinkStatus) is handled here
  // and true returned.
  bool OnMessage(int worker, const ReceivedMessage& m);
  // Starts the fetches of requests whose prefill phase ended, ends fetches past their time, and
  // sends each request whose wait ended; returns those whose send failed.
  std::vector<Unsent> SendReady(const std::vector<WorkerView>& views);
  // Forgets a fetch (its request was aborted, moved or ended); 0: none.
  void Cancel(uint64_t fetch) { fetches_->Cancel(fetch); }
  // Joins and retires links (a periodic turn).
  void Refresh(const std::vector<WorkerView>& views);

  // The achieved transfer rate so far (KvFetches::gbps), and the fetches in flight.
  [[nodiscard]] double gbps() const { return fetches_->gbps(); }
  [[nodiscard]] size_t in_flight() const { return fetches_->in_flight(); }

 private:
  // A prefill phase that ended: the request it was for, its own id, the prefill worker, and
  // whether the KV is there.
  struct Prefilled {
    std::string request_id, prefill_id;
    int worker = -1;
    bool ok = false;
  };

  // A fetch from a peer, when worth it: its number (0: none).
  uint64_t MaybeFetch(frontend::Job& job, const std::vector<WorkerView>& views,
                      const std::vector<BlockHash>& hashes, int to);
  // The prefill phase, when one is due and could be sent: its id (empty: none). `*first_block`:
  // the first block `to` lacks. `*stream`: the fetch streaming the phase's blocks over a link
  // (0: none), which sends the request when it ends, whether the phase ended or not.
  std::string MaybeDisaggregate(frontend::Job& job, const std::vector<BlockHash>& hashes, int to,
                                int* first_block, uint64_t* stream);
  // The prefill workers ready to prefill for `decode` (its KV shape), with the books' load.
  std::vector<WorkerView> PrefillWorkers(const WorkerView& decode,
                                         const std::vector<WorkerView>& views) const;
  // `job`'s prefill phase on `worker`: its prompt alone, one greedy token nobody reads; its end
  // is queued in prefilled_.
  std::shared_ptr<frontend::Job> PrefillPhase(const frontend::Job& job, int worker,
                                              int predicted_cached);
  // As prefill phases end, starts each request's fetch from its prefill worker (or marks it
  // done at once when the phase failed).
  void StartDecodes();

  const Options options_;
  WorkerPool* const pool_;
  PrefixIndex* const index_;
  Books* const books_;
  RoutingPolicy* const policy_;
  std::unique_ptr<KvLinks> links_;  // null: --kv-links off
  std::unique_ptr<KvFetches> fetches_;
  std::vector<Prefilled> prefilled_;   // since the last SendReady
  std::vector<KvFetches::Done> done_;  // fetches ended since the last SendReady
};

}  // namespace kvserve::router

#endif  // KVSERVE_ROUTER_KV_MOVEMENT_H_
