// RouterCore: placing requests on workers. A request goes to the worker the policy picks among
// those with room (router/routing/routing_policy.h), on the router's own books of load; when every
// eligible worker is at its limit it waits in the queue, in arrival order (a moved request
// first), until one has room, its deadline passes or --max-queue-wait-seconds. Core thread.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "router/router_core.h"
#include "router/router_metrics.h"

namespace kvserve::router {
namespace {

namespace pb = ::kvserve::v1;

// Whether a pick job may go to worker `v`: it serves HTTP, at an endpoint of the gateway's
// subset when one is given ("ip:port", or "ip" for any of its ports, as the reference picker
// reads the hint).
bool Pickable(const Job::Pick& pick, const WorkerView& v) {
  if (v.http_endpoint.empty()) return false;
  if (!pick.subset) return true;
  const std::string_view host =
      std::string_view(v.http_endpoint).substr(0, v.http_endpoint.rfind(':'));
  return std::ranges::any_of(
      *pick.subset, [&](const std::string& e) { return e == v.http_endpoint || e == host; });
}

}  // namespace

absl::flat_hash_map<int, RouterCore::Load> RouterCore::InflightLoad() const {
  KVSERVE_CHECK_THREAD(core_thread_);
  // Each request in flight counts for the blocks it will hold.
  absl::flat_hash_map<int, Load> load;
  for (const auto& [id, placed] : inflight_) {
    const pb::GenerateRequest& r = placed.job->request;
    const pb::WorkerStatus* st = pool_->status(placed.worker);
    const int bs = st != nullptr ? std::max(1, st->block_size()) : 16;
    Load& l = load[placed.worker];
    l.blocks += (r.prompt_token_ids_size() + r.max_tokens() + bs - 1) / bs;
    ++l.requests;
    const int n = std::max(1, r.sampling().n());
    l.sequences += n;
    if (placed.started) {
      l.decode_seqs += n;
    } else {
      l.prefill_tokens +=
          std::max(0, r.prompt_token_ids_size() - static_cast<int>(r.predicted_cached_tokens()));
    }
  }
  return load;
}

int RouterCore::InflightLimit(int w) const {
  KVSERVE_CHECK_THREAD(core_thread_);
  if (options_.admission.max_inflight_per_worker > 0)
    return options_.admission.max_inflight_per_worker;
  const pb::WorkerStatus* st = pool_->status(w);
  return st != nullptr ? std::max(0, st->max_num_seqs()) : 0;
}

void RouterCore::Place(const std::shared_ptr<Job>& job, int attempts, int exclude) {
  KVSERVE_CHECK_THREAD(core_thread_);
  Move move{.job = job, .attempts = attempts, .from = exclude};
  // A new request waits behind those already waiting; one that moves came before them.
  const bool moves = attempts > 1;
  if (queue_.depth() > 0 && !moves) return Enqueue(std::move(move), /*front=*/false);
  const Placement placed = TryPlace(job, attempts, exclude);
  if (placed == Placement::kFull) return Enqueue(std::move(move), moves);
  // Waits in the queue and moves are not the router's overhead: only a first placement at once
  // counts as the router's own time.
  if (placed == Placement::kPlaced && !moves) queue_.PlacedAtOnce(*job);
}

void RouterCore::Enqueue(Move move, bool front) {
  KVSERVE_CHECK_THREAD(core_thread_);
  queue_.Push({.job = std::move(move.job), .attempts = move.attempts, .from = move.from}, front);
}

void RouterCore::PlaceQueued() {
  KVSERVE_CHECK_THREAD(core_thread_);
  queue_.PlaceInOrder([&](frontend::AdmissionQueue::Entry& e) {
    KVSERVE_CHECK_THREAD(core_thread_);  // called back on this thread
    return TryPlace(e.job, e.attempts, e.from) != Placement::kFull;
  });
}

void RouterCore::ExpireWaits() {
  KVSERVE_CHECK_THREAD(core_thread_);
  const auto now = std::chrono::steady_clock::now();
  queue_.Expire(now);
  for (auto it = inflight_.begin(); it != inflight_.end();) {
    Placed& p = it->second;
    if (now < p.job->deadline) {
      ++it;
      continue;
    }
    if (p.fetch != 0 || !p.prefill.empty()) {  // not sent yet: only its fetch stops
      fetches_->Cancel(p.fetch);               // (a prefill phase runs on, its end ignored)
    } else {
      pb::AbortRequest a;
      a.set_request_id(it->first);
      a.set_reason("deadline passed");
      pool_->Send(p.worker, a).IgnoreError();
    }
    index_.ForgetRouted(p.worker, p.hashes);
    if (options_.metrics != nullptr) options_.metrics->CountRejected("deadline");
    p.job->on_response(frontend::ErrorReply(it->first, absl::StatusCode::kDeadlineExceeded,
                                            frontend::kDeadlineMessage));
    inflight_.erase(it++);
  }
}

bool RouterCore::MarkRoom(const Job& job, int exclude, std::vector<WorkerView>& views) {
  KVSERVE_CHECK_THREAD(core_thread_);
  // Load from the router's own books: heartbeats lag (250 ms), and a worker that just finished
  // a request would look busy. The worker that just failed this request is not eligible, nor
  // one at its limit of requests; when only the limit stands in the way, the job waits.
  absl::flat_hash_map<int, Load> load = InflightLoad();
  // A worker not heard from yet (the router just started) may be about to take it: wait too.
  bool ready = false, room = false, unheard = false;
  for (WorkerView& v : views) {
    unheard = unheard || pool_->status(v.id) == nullptr;
    // A prefill-only worker takes prefill phases alone (MaybeDisaggregate), never a request.
    if (v.id == exclude || v.prefill_only) v.eligible = false;
    if (job.pick && !Pickable(*job.pick, v)) v.eligible = false;
    v.active_blocks = load[v.id].blocks;
    v.queued_prefill_tokens = load[v.id].prefill_tokens;
    v.decode_seqs = load[v.id].decode_seqs;
    ready = ready || v.eligible;
    const int limit = InflightLimit(v.id);
    const Load& l = load[v.id];
    const int n = std::max(1, job.request.sampling().n());
    if (limit > 0 && l.sequences > 0 && l.sequences + n > limit) v.eligible = false;
    room = room || v.eligible;
  }
  return room || !(ready || unheard);
}

std::vector<BlockHash> RouterCore::PromptHashes(const pb::GenerateRequest& request,
                                                const std::vector<WorkerView>& views) {
  KVSERVE_CHECK_THREAD(core_thread_);
  for (const WorkerView& v : views) {
    if (!v.eligible) continue;
    absl::StatusOr<std::string> key = pool_->ExtraKey(v.id, request.cache_salt());
    if (!key.ok()) break;
    std::vector<uint32_t> ids(request.prompt_token_ids().begin(), request.prompt_token_ids().end());
    return HashFullBlocks(ids, pool_->status(v.id)->block_size(), *key);
  }
  return {};
}

RouterCore::Placement RouterCore::TryPlace(const std::shared_ptr<Job>& job, int attempts,
                                           int exclude) {
  KVSERVE_CHECK_THREAD(core_thread_);
  std::vector<WorkerView> views = pool_->Views();
  if (!MarkRoom(*job, exclude, views)) return Placement::kFull;
  std::vector<BlockHash> hashes = PromptHashes(job->request, views);
  const std::vector<FetchOffer> offers =
      FetchOffers(options_.kv_fetch, fetches_->gbps(), views, index_, hashes);
  absl::StatusOr<Decision> d =
      Route(*policy_, views, index_,
            {.hashes = hashes,
             .prompt_tokens = job->request.prompt_token_ids_size(),
             .max_tokens = job->request.max_tokens() * std::max(1, job->request.sampling().n()),
             .session_key = job->session_key,
             .fetch_offers = offers});
  const std::string& id = job->request.request_id();
  if (!d.ok()) {
    job->on_response(frontend::ErrorReply(id, d.status().code(), d.status().message()));
    return Placement::kFailed;
  }
  if (options_.metrics != nullptr) {
    std::string name;
    for (const WorkerView& v : views) {
      if (v.id == d->worker) name = v.name;
    }
    options_.metrics->CountDecision(std::string(RouteReasonName(d->reason)), name);
  }
  const pb::WorkerStatus* st = pool_->status(d->worker);
  job->request.set_predicted_cached_tokens(d->predicted_cached_blocks *
                                           std::max(1, st->block_size()));
  uint64_t fetch = 0;
  std::string prefill;
  int prefill_first = 0;
  if (job->pick) {
    // Never sent, so never moved: a lost worker ends it (and the gateway's request fails there).
    attempts = kMaxPlacementAttempts;
    job->pick->on_pick(PickEndpoints(*job, views, hashes, d->worker));
  } else if (prefill = MaybeDisaggregate(*job, hashes, d->worker, &prefill_first, &fetch);
             !prefill.empty()) {
    // Sent once its prefill ended and its worker has the prefill worker's blocks (StartDecodes),
    // or once the blocks streamed (SendFetched).
  } else if (fetch = MaybeFetch(*job, views, hashes, d->worker); fetch != 0) {
    // Sent once its worker has the peer's blocks (SendFetched).
  } else if (absl::Status s = pool_->Send(d->worker, job->request); !s.ok()) {
    job->on_response(frontend::ErrorReply(id, absl::StatusCode::kUnavailable, s.message()));
    return Placement::kFailed;
  }
  index_.RecordRouted(d->worker, hashes);  // approximate until the worker's events arrive
  inflight_[id] = Placed{.worker = d->worker,
                         .job = job,
                         .attempts = attempts,
                         .instance_id = st != nullptr ? st->instance_id() : 0,
                         .hashes = std::move(hashes),
                         .fetch = fetch,
                         .prefill = std::move(prefill),
                         .prefill_first = prefill_first};
  return Placement::kPlaced;
}

std::vector<std::string> RouterCore::PickEndpoints(const Job& job, std::vector<WorkerView> views,
                                                   const std::vector<BlockHash>& hashes,
                                                   int first) {
  KVSERVE_CHECK_THREAD(core_thread_);
  std::vector<std::string> endpoints;
  int picked = first;
  for (int k = 0;; ++k) {
    for (WorkerView& v : views) {
      if (v.id != picked) continue;
      endpoints.push_back(v.http_endpoint);
      v.eligible = false;
    }
    if (k == job.pick->fallbacks) break;
    absl::StatusOr<Decision> next = Route(*policy_, views, index_,
                                          {.hashes = hashes,
                                           .prompt_tokens = job.request.prompt_token_ids_size(),
                                           .max_tokens = job.request.max_tokens(),
                                           .session_key = job.session_key});
    if (!next.ok()) break;  // none left
    picked = next->worker;
  }
  return endpoints;
}

}  // namespace kvserve::router
