#include "router/placer.h"

#include <algorithm>

#include "router/router_metrics.h"

namespace kvserve::router {
namespace {

namespace pb = ::kvserve::v1;
using frontend::Job;

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

Placer::Placer(const Options& options, WorkerPool* pool, PrefixIndex* index, Books* books,
               KvMovement* kv, RoutingPolicy* policy)
    : options_(options),
      pool_(pool),
      index_(index),
      books_(books),
      kv_(kv),
      policy_(policy),
      queue_(options.admission, options.metrics) {}

int Placer::InflightLimit(int w) const {
  if (options_.admission.max_inflight_per_worker > 0) {
    return options_.admission.max_inflight_per_worker;
  }
  const pb::WorkerStatus* st = pool_->status(w);
  return st != nullptr ? std::max(0, st->max_num_seqs()) : 0;
}

void Placer::Place(const std::shared_ptr<Job>& job, int attempts, int exclude) {
  const frontend::AdmissionQueue::Entry entry{.job = job, .attempts = attempts, .from = exclude};
  // A new request waits behind those already waiting; one that moves came before them.
  const bool moves = attempts > 1;
  if (queue_.depth() > 0 && !moves) return queue_.Push(entry, /*front=*/false);
  const Placement placed = TryPlace(job, attempts, exclude);
  if (placed == Placement::kFull) return queue_.Push(entry, /*front=*/moves);
  // Waits in the queue and moves are not the router's overhead: only a first placement at once
  // counts as the router's own time.
  if (placed == Placement::kPlaced && !moves) queue_.PlacedAtOnce(*job);
}

void Placer::PlaceQueued() {
  queue_.PlaceInOrder([&](frontend::AdmissionQueue::Entry& e) {
    return TryPlace(e.job, e.attempts, e.from) != Placement::kFull;
  });
}

void Placer::MoveOrFail(const std::string& request_id, const Placed& placed, absl::string_view why,
                        bool may_return) {
  index_->ForgetRouted(placed.worker, placed.hashes);  // it leaves that worker, or fails
  kv_->Cancel(placed.fetch);
  if (placed.movable()) {
    moves_.push_back({.job = placed.job,
                      .attempts = placed.attempts + 1,
                      .from = may_return ? -1 : placed.worker});
    ++moved_;
    return;
  }
  placed.job->on_response(frontend::ErrorReply(request_id, absl::StatusCode::kUnavailable, why));
}

void Placer::PlaceMoves() {
  std::vector<Move> moves;
  std::swap(moves, moves_);
  for (Move& m : moves) Place(m.job, m.attempts, m.from);
}

bool Placer::MarkRoom(const Job& job, int exclude, std::vector<WorkerView>& views) const {
  // The worker that just failed this request is not eligible, nor one at its limit of
  // requests; when only the limit stands in the way, the job waits.
  absl::flat_hash_map<int, Load> load = books_->LoadByWorker(*pool_);
  // A worker not heard from yet (the router just started) may be about to take it: wait too.
  bool ready = false, room = false, unheard = false;
  for (WorkerView& v : views) {
    unheard = unheard || pool_->status(v.id) == nullptr;
    // A prefill-only worker takes prefill phases alone (KvMovement), never a request.
    if (v.id == exclude || v.prefill_only) v.eligible = false;
    if (job.pick && !Pickable(*job.pick, v)) v.eligible = false;
    const Load& l = load[v.id];
    v.active_blocks = l.blocks;
    v.queued_prefill_tokens = l.prefill_tokens;
    v.decode_seqs = l.decode_seqs;
    ready = ready || v.eligible;
    const int limit = InflightLimit(v.id);
    const int n = std::max(1, job.request.sampling().n());
    if (limit > 0 && l.sequences > 0 && l.sequences + n > limit) v.eligible = false;
    room = room || v.eligible;
  }
  return room || !(ready || unheard);
}

std::vector<BlockHash> Placer::PromptHashes(const pb::GenerateRequest& request,
                                            const std::vector<WorkerView>& views) const {
  for (const WorkerView& v : views) {
    if (!v.eligible) continue;
    absl::StatusOr<std::string> key = pool_->ExtraKey(v.id, request.cache_salt());
    if (!key.ok()) break;
    std::vector<uint32_t> ids(request.prompt_token_ids().begin(), request.prompt_token_ids().end());
    return HashFullBlocks(ids, pool_->status(v.id)->block_size(), *key);
  }
  return {};
}

void Placer::CountDecision(const Decision& d, const std::vector<WorkerView>& views) const {
  if (options_.metrics == nullptr) return;
  std::string name;
  for (const WorkerView& v : views) {
    if (v.id == d.worker) name = v.name;
  }
  options_.metrics->CountDecision(std::string(RouteReasonName(d.reason)), name);
}

Placer::Placement Placer::TryPlace(const std::shared_ptr<Job>& job, int attempts, int exclude) {
  std::vector<WorkerView> views = pool_->Views();
  if (!MarkRoom(*job, exclude, views)) return Placement::kFull;
  std::vector<BlockHash> hashes = PromptHashes(job->request, views);
  const std::vector<FetchOffer> offers =
      FetchOffers(options_.kv_fetch, kv_->gbps(), views, *index_, hashes);
  absl::StatusOr<Decision> d =
      Route(*policy_, views, *index_,
            {.hashes = hashes,
             .prompt_tokens = job->request.prompt_token_ids_size(),
             .max_tokens = job->request.max_tokens() * std::max(1, job->request.sampling().n()),
             .session_key = job->session_key,
             .fetch_offers = offers,
             .other_replicas = books_->OthersPlacing(*pool_, std::chrono::steady_clock::now())});
  const std::string& id = job->request.request_id();
  if (!d.ok()) {
    job->on_response(frontend::ErrorReply(id, d.status().code(), d.status().message()));
    return Placement::kFailed;
  }
  CountDecision(*d, views);
  // Not numbered until sent (a move's number was its last worker's).
  job->request.clear_router_id();
  job->request.clear_placement();
  const pb::WorkerStatus* st = pool_->status(d->worker);
  job->request.set_predicted_cached_tokens(d->predicted_cached_blocks *
                                           std::max(1, st->block_size()));
  KvMovement::Wait wait;
  if (job->pick) {
    // Never sent, so never moved: a lost worker ends it (and the gateway's request fails there).
    attempts = kMaxPlacementAttempts;
    job->pick->on_pick(PickEndpoints(*job, views, hashes, d->worker));
  } else if (wait = kv_->Start(*job, views, hashes, d->worker); wait.any()) {
    // Sent once its wait ends (KvMovement::SendReady).
  } else {
    books_->Number(*pool_, d->worker, job->request);
    if (absl::Status s = pool_->Send(d->worker, job->request); !s.ok()) {
      job->on_response(frontend::ErrorReply(id, absl::StatusCode::kUnavailable, s.message()));
      return Placement::kFailed;
    }
  }
  index_->RecordRouted(d->worker, hashes);  // approximate until the worker's events arrive
  books_->Add(id, Placed{.worker = d->worker,
                         .job = job,
                         .attempts = attempts,
                         .instance_id = st != nullptr ? st->instance_id() : 0,
                         .hashes = std::move(hashes),
                         .link_epoch = pool_->link_epoch(d->worker),
                         .fetch = wait.fetch,
                         .prefill = std::move(wait.prefill),
                         .prefill_first = wait.prefill_first});
  return Placement::kPlaced;
}

std::vector<std::string> Placer::PickEndpoints(const Job& job, std::vector<WorkerView> views,
                                               const std::vector<BlockHash>& hashes, int first) {
  std::vector<std::string> endpoints;
  int picked = first;
  for (int k = 0;; ++k) {
    for (WorkerView& v : views) {
      if (v.id != picked) continue;
      endpoints.push_back(v.http_endpoint);
      v.eligible = false;
    }
    if (k == job.pick->fallbacks) break;
    absl::StatusOr<Decision> next = Route(*policy_, views, *index_,
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
