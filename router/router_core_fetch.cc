// RouterCore: peer prefix fetch (router/kv_fetch.h). A request routed to a worker that lacks a
// prefix a peer caches further waits, placed but not sent, while its worker pulls the blocks;
// it is sent when the fetch ends, whether the blocks came or not.
#include "glog/logging.h"
#include "router/router_core.h"

namespace kvserve::router {

uint64_t RouterCore::MaybeFetch(Job& job, const std::vector<WorkerView>& views,
                                const std::vector<BlockHash>& hashes, int to) {
  KVSERVE_CHECK_THREAD(core_thread_);
  std::optional<FetchPlan> plan =
      PlanFetch(options_.kv_fetch, fetches_->gbps(), views, index_, hashes, to);
  if (!plan) return 0;
  const uint64_t fetch = fetches_->Start(job.request, to, *plan, std::chrono::steady_clock::now());
  if (fetch != 0) {
    const int bs = std::max(1, pool_->status(to)->block_size());
    job.request.set_predicted_cached_tokens((plan->first_block + plan->blocks) * bs);
    VLOG(1) << "request " << job.request.request_id() << ": worker " << to << " fetches "
            << plan->blocks << " blocks from worker " << plan->source << " (about "
            << plan->transfer_s * 1e3 << " ms against " << plan->prefill_s * 1e3
            << " ms of prefill)";
  }
  return fetch;
}

void RouterCore::SendFetched(std::vector<KvFetches::Done>& done) {
  KVSERVE_CHECK_THREAD(core_thread_);
  std::vector<Move> moves;
  for (const KvFetches::Done& d : done) {
    auto it = inflight_.find(d.request_id);
    // Aborted, moved or ended while its fetch ran: nothing to send.
    if (it == inflight_.end() || it->second.fetch != d.fetch) continue;
    Placed& p = it->second;
    p.fetch = 0;
    if (!d.status.ok()) {
      VLOG(1) << "request " << d.request_id << ": fetch ended without its blocks (" << d.status
              << "); it prefills them";
      if (const kvserve::v1::WorkerStatus* st = pool_->status(p.worker); st != nullptr) {
        p.job->request.set_predicted_cached_tokens((d.first_block + d.blocks_added) *
                                                   std::max(1, st->block_size()));
      }
    }
    if (absl::Status s = pool_->Send(p.worker, p.job->request); !s.ok()) {
      MoveOrFail(it->first, p, s.message(), moves);
      inflight_.erase(it);
    }
  }
  done.clear();
  PlaceMoves(moves);
}

}  // namespace kvserve::router
