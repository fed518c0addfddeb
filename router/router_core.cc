#include "router/router_core.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "router/recycle_coordinator.h"
#include "router/router_metrics.h"

namespace kvserve::router {
namespace {

namespace pb = ::kvserve::v1;

pb::GenerateResponse ErrorResponse(const std::string& id, absl::StatusCode code,
                                   absl::string_view message) {
  pb::GenerateResponse r;
  r.set_request_id(id);
  r.set_finish_reason(pb::FINISH_REASON_ERROR);
  r.mutable_error()->set_code(static_cast<int>(code));
  r.mutable_error()->set_message(std::string(message));
  return r;
}

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

// A worker that refused a request because it is draining: nothing ran.
bool RefusedWhileDraining(const pb::GenerateResponse& r) {
  return r.finish_reason() == pb::FINISH_REASON_ERROR &&
         r.error().code() == static_cast<int>(absl::StatusCode::kFailedPrecondition);
}

}  // namespace

RouterCore::RouterCore(const RouterOptions& options)
    : options_(options), wake_fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
  PCHECK(wake_fd_ >= 0) << "eventfd";
  absl::StatusOr<std::unique_ptr<RoutingPolicy>> policy = MakeRoutingPolicy(options.routing);
  CHECK(policy.ok()) << policy.status();  // the caller checks the options (kvserve-router does)
  policy_ = *std::move(policy);
  pool_ = std::make_unique<WorkerPool>(ctx_, &index_, options.heartbeat_timeout, options.curve);
  for (const WorkerEndpoint& e : options.workers) pool_->Add(e);
  if (options.kv_fetch.links) {
    links_ = std::make_unique<KvLinks>(pool_.get(), options.kv_fetch.link_timeout);
    if (options.metrics != nullptr) options.metrics->StartKvLinks();
  }
  fetches_ =
      std::make_unique<KvFetches>(options.kv_fetch, pool_.get(), options.metrics, links_.get());
  if (options.kv_fetch.enabled && options.metrics != nullptr) {
    options.metrics->StartKvFetch(options.kv_fetch.initial_gbps);
  }
  if (options.workers_dns) {
    discovery_ = std::make_unique<DnsDiscovery>(
        *options.workers_dns, options.dns_refresh,
        options.dns_resolver ? options.dns_resolver : DnsDiscovery::Resolver(ResolveHost));
  }
}

RouterCore::~RouterCore() {
  Stop();
  close(wake_fd_);
}

void RouterCore::Wake() {
  const uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
}

void RouterCore::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void RouterCore::Stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void RouterCore::Submit(std::shared_ptr<Job> job) {
  {
    absl::MutexLock lock(&mu_);
    inbox_.jobs.push_back(std::move(job));
  }
  Wake();
}

void RouterCore::Abort(const std::string& request_id) {
  {
    absl::MutexLock lock(&mu_);
    inbox_.aborts.push_back(request_id);
  }
  Wake();
}

void RouterCore::Started(const std::string& request_id) {
  {
    absl::MutexLock lock(&mu_);
    inbox_.started.push_back(request_id);
  }
  Wake();
}

std::vector<WorkerInfo> RouterCore::Workers() const {
  absl::MutexLock lock(&info_mu_);
  return info_;
}

absl::Status RouterCore::Control(const std::string& worker_name, pb::ControlAction action) {
  int id = -1;
  {
    absl::MutexLock lock(&info_mu_);  // static and discovered workers alike
    for (const WorkerInfo& w : info_) {
      if (w.name == worker_name) id = w.id;
    }
  }
  if (id < 0) {
    for (size_t i = 0; i < options_.workers.size(); ++i) {  // before the first publication
      if (options_.workers[i].name == worker_name) id = static_cast<int>(i);
    }
  }
  if (id < 0) return absl::NotFoundError(absl::StrCat("no worker '", worker_name, "'"));
  {
    absl::MutexLock lock(&mu_);
    inbox_.controls.emplace_back(id, action);
  }
  Wake();
  return absl::OkStatus();
}

void RouterCore::Loop() {
  KVSERVE_CHECK_THREAD(core_thread_);
  while (!stop_) {
    if (discovery_ != nullptr) {
      if (std::optional<std::vector<WorkerEndpoint>> found = discovery_->TakeIfChanged()) {
        SyncWorkers(*found);
      }
    }
    Inbox inbox = TakeInbox();
    SendControls(inbox.controls);
    PlaceQueued();  // those waiting came first
    for (auto& job : inbox.jobs) Place(job);
    SendAborts(inbox.aborts);
    for (const std::string& id : inbox.started) {
      if (auto it = inflight_.find(id); it != inflight_.end()) it->second.started = true;
    }
    // Idle, the loop sleeps until a message or Wake() comes, or its next periodic turn
    // (kIdleTurnMs; it was 5 ms, a quarter of the router's CPU on the Mooncake trace).
    std::vector<KvFetches::Done> fetched;
    const int wait_ms = inbox.jobs.empty() && fetches_->in_flight() == 0 ? kIdleTurnMs : 0;
    for (auto& [w, m] : pool_->Poll(wait_ms, wake_fd_)) {
      if (m.type == "KvChunk" || m.type == "KvChunkAck") {
        fetches_->OnMessage(w, m, std::chrono::steady_clock::now(), fetched);
        continue;
      }
      if (m.type == "KvLinkStatus") {
        pb::KvLinkStatus st;
        if (links_ && ParseMessage(m, &st).ok()) {
          links_->OnStatus(w, st, std::chrono::steady_clock::now());
        }
        continue;
      }
      if (m.type != "GenerateResponse") continue;
      pb::GenerateResponse r;
      if (ParseMessage(m, &r).ok()) HandleResponse(w, r);
    }
    PlaceQueued();  // finished requests made room
    const std::vector<WorkerView> views = pool_->Views();
    StartDecodes(fetched);
    fetches_->Expire(views, std::chrono::steady_clock::now(), fetched);
    SendFetched(fetched);
    UpdateReadiness(views);
    if (auto now = std::chrono::steady_clock::now();
        now - last_info_ > std::chrono::milliseconds(50)) {
      ExpireWaits();
      if (links_) {
        links_->Refresh(views, now);
        if (options_.metrics != nullptr) options_.metrics->SetKvLinksReady(links_->ready());
      }
      PublishInfo(views);
      index_.Expire(absl::Now());
      last_info_ = now;
    }
    Coordinate(views);
    RescueLost(views);
  }
}

RouterCore::Inbox RouterCore::TakeInbox() {
  uint64_t wakes = 0;
  (void)!read(wake_fd_, &wakes, sizeof(wakes));  // reset: what woke us is taken now
  Inbox taken;
  absl::MutexLock lock(&mu_);
  std::swap(taken, inbox_);
  return taken;
}

void RouterCore::SendControls(const std::vector<std::pair<int, pb::ControlAction>>& controls) {
  KVSERVE_CHECK_THREAD(core_thread_);
  for (const auto& [w, action] : controls) {
    pb::Control c;
    c.set_action(action);
    c.set_reason("admin");
    c.set_coordinator_id(options_.coordinator_id);
    pool_->Send(w, c).IgnoreError();
  }
}

void RouterCore::SendAborts(const std::vector<std::string>& aborts) {
  KVSERVE_CHECK_THREAD(core_thread_);
  for (const std::string& id : aborts) {
    auto it = inflight_.find(id);
    if (it == inflight_.end()) {  // still waiting for a worker, or already ended
      std::erase_if(queue_,
                    [&](const Waiting& w) { return w.move.job->request.request_id() == id; });
      queued_ = static_cast<int>(queue_.size());
      continue;
    }
    if (it->second.job->pick) {  // never sent: it only leaves the books
      inflight_.erase(it);
      continue;
    }
    if (!it->second.prefill.empty()) {  // not sent yet: its prefill phase stops
      if (auto pre = inflight_.find(it->second.prefill); pre != inflight_.end()) {
        pb::AbortRequest a;
        a.set_request_id(pre->first);
        a.set_reason("client disconnected");
        pool_->Send(pre->second.worker, a).IgnoreError();
        index_.ForgetRouted(pre->second.worker, pre->second.hashes);
        inflight_.erase(pre);
      }
      it = inflight_.find(id);
    } else if (it->second.fetch != 0) {  // not sent yet: its fetch stops
      fetches_->Cancel(it->second.fetch);
    } else {
      pb::AbortRequest a;
      a.set_request_id(id);
      a.set_reason("client disconnected");
      pool_->Send(it->second.worker, a).IgnoreError();
    }
    index_.ForgetRouted(it->second.worker, it->second.hashes);
    inflight_.erase(it);
  }
}

void RouterCore::HandleResponse(int worker, const pb::GenerateResponse& r) {
  KVSERVE_CHECK_THREAD(core_thread_);
  auto it = inflight_.find(r.request_id());
  if (it == inflight_.end() || it->second.worker != worker) return;  // a moved request's old one
  if (!InSequence(it->first, it->second, r)) {
    inflight_.erase(it);
    return;
  }
  if (RefusedWhileDraining(r) && CanMove(it->second)) {
    // The worker started draining before it saw the request: send it elsewhere.
    std::vector<Move> moves;
    MoveOrFail(it->first, it->second, "", moves);
    inflight_.erase(it);
    return PlaceMoves(moves);
  }
  it->second.started = true;
  std::shared_ptr<Job> job = it->second.job;
  const bool failed =
      r.finish_reason() == pb::FINISH_REASON_ERROR || r.finish_reason() == pb::FINISH_REASON_ABORT;
  // A request that failed or was aborted did not leave its blocks cached as assumed.
  if (failed) index_.ForgetRouted(worker, it->second.hashes);
  if (r.has_usage() || failed) inflight_.erase(it);
  if (r.has_usage() && options_.metrics != nullptr) {
    options_.metrics->CountCached(job->request.predicted_cached_tokens(),
                                  r.usage().cached_prompt_tokens());
  }
  job->on_response(r);
}

bool RouterCore::InSequence(const std::string& request_id, Placed& p,
                            const pb::GenerateResponse& r) {
  KVSERVE_CHECK_THREAD(core_thread_);
  if (r.seq() == p.next_seq) {
    ++p.next_seq;
    return true;
  }
  ++reply_gaps_;
  std::string worker_name;
  for (const WorkerView& v : pool_->Views()) {
    if (v.id == p.worker) worker_name = v.name;
  }
  LOG_EVERY_T(WARNING, 10) << "worker " << worker_name << ": reply " << r.seq() << " to "
                           << request_id << " where " << p.next_seq << " was due";
  if (options_.metrics != nullptr) options_.metrics->CountReplyGap(worker_name);
  pb::AbortRequest a;
  a.set_request_id(request_id);
  a.set_reason("replies lost on the link");
  pool_->Send(p.worker, a).IgnoreError();
  index_.ForgetRouted(p.worker, p.hashes);
  p.job->on_response(ErrorResponse(
      request_id, absl::StatusCode::kUnavailable,
      absl::StrCat("replies from the worker were lost on the way (reply ", r.seq(), " came where ",
                   p.next_seq, " was due); the request was stopped, retry it")));
  return false;
}

void RouterCore::UpdateReadiness(const std::vector<WorkerView>& views) {
  KVSERVE_CHECK_THREAD(core_thread_);
  int eligible = 0;
  for (const WorkerView& v : views) eligible += v.eligible ? 1 : 0;
  if (eligible != eligible_.load() || static_cast<int>(views.size()) != known_.load()) {
    LOG(INFO) << "kvserve-router: " << eligible << "/" << views.size() << " workers ready";
  }
  known_ = static_cast<int>(views.size());
  eligible_ = eligible;
}

// Recycle slots, from the states the workers themselves publish (router/recycle_coordinator.h).
void RouterCore::Coordinate(const std::vector<WorkerView>& views) {
  KVSERVE_CHECK_THREAD(core_thread_);
  if (!options_.coordinate_recycles) {
    pool_->TakeRecycleAsks();  // another replica answers them
    return;
  }
  std::vector<RecycleView> workers;
  for (const WorkerView& v : views) {
    RecycleView w{.id = v.id, .name = v.name, .eligible = v.eligible};
    const pb::WorkerStatus* st = pool_->status(v.id);
    if (st != nullptr) {
      w.recycle_pending = st->recycle_pending();
      w.recycle_grant_ms = st->recycle_grant_ms();
      w.instance_id = st->instance_id();
    }
    // A grant stays in flight until the worker's heartbeats show it out of rotation (or two
    // heartbeat timeouts pass: the grant was lost, or refused).
    if (auto it = grants_in_flight_.find(v.id); it != grants_in_flight_.end()) {
      const bool shown = !v.eligible || w.recycle_pending;
      const auto age = std::chrono::steady_clock::now() - it->second;
      if (shown || age > 2 * absl::ToChronoNanoseconds(options_.heartbeat_timeout)) {
        grants_in_flight_.erase(it);
      } else {
        w.grant_in_flight = true;
      }
    }
    workers.push_back(std::move(w));
  }
  std::vector<RecycleAsk> asks;
  for (auto& [w, instance, reason] : pool_->TakeRecycleAsks()) {
    asks.push_back({w, instance, std::move(reason)});
  }
  CoordinatorDecision d = CoordinateRecycles({options_.max_unavailable, options_.coordinator_id},
                                             workers, std::move(asks), revoked_);
  for (auto& [w, control] : d.messages) {
    if (control.action() == pb::CONTROL_ACTION_RECYCLE_GRANT) {
      grants_in_flight_[w] = std::chrono::steady_clock::now();
    }
    pool_->Send(w, control).IgnoreError();
  }
  for (std::string& key : d.revoked) revoked_.insert(std::move(key));
  grants_ += d.grants;
  revokes_ += static_cast<int64_t>(d.revoked.size());
}

void RouterCore::RescueLost(const std::vector<WorkerView>& views) {
  KVSERVE_CHECK_THREAD(core_thread_);
  std::vector<Move> moves;
  for (auto it = inflight_.begin(); it != inflight_.end();) {
    const Placed& p = it->second;
    const pb::WorkerStatus* st = pool_->status(p.worker);
    if (st == nullptr) {  // never heard from it yet
      ++it;
      continue;
    }
    bool lost = true;
    for (const WorkerView& v : views) {
      // Heard from within the timeout, whether serving or draining on purpose (it finishes
      // what it has): not lost. A stale heartbeat is lost in every state, draining included.
      if (v.id == p.worker && v.fresh) lost = false;
    }
    // Restarted (killed and brought back before its heartbeat went stale): the new process
    // never heard of the request.
    if (p.instance_id != 0 && st->instance_id() != p.instance_id) lost = true;
    if (!lost) {
      ++it;
      continue;
    }
    MoveOrFail(it->first, p, "the worker serving this request stopped responding", moves);
    inflight_.erase(it++);
  }
  PlaceMoves(moves);
}

void RouterCore::MoveOrFail(const std::string& request_id, const Placed& p, absl::string_view why,
                            std::vector<Move>& moves) {
  KVSERVE_CHECK_THREAD(core_thread_);
  index_.ForgetRouted(p.worker, p.hashes);  // it leaves that worker, or fails
  fetches_->Cancel(p.fetch);
  if (CanMove(p)) {
    moves.push_back({.job = p.job, .attempts = p.attempts + 1, .from = p.worker});
    ++moved_;
    return;
  }
  p.job->on_response(ErrorResponse(request_id, absl::StatusCode::kUnavailable, why));
}

void RouterCore::PlaceMoves(std::vector<Move>& moves) {
  KVSERVE_CHECK_THREAD(core_thread_);
  for (Move& m : moves) Place(m.job, m.attempts, m.from);
  moves.clear();
}

void RouterCore::SyncWorkers(const std::vector<WorkerEndpoint>& endpoints) {
  KVSERVE_CHECK_THREAD(core_thread_);
  absl::flat_hash_map<std::string, int> active;
  for (const WorkerView& v : pool_->Views()) active[v.name] = v.id;
  absl::flat_hash_map<std::string, const WorkerEndpoint*> wanted;
  for (const WorkerEndpoint& e : endpoints) wanted[e.name] = &e;
  std::vector<Move> moves;
  for (const auto& [name, w] : active) {
    if (wanted.contains(name)) continue;
    LOG(INFO) << "kvserve-router: worker " << name << " left the discovered set";
    for (auto it = inflight_.begin(); it != inflight_.end();) {
      if (it->second.worker != w) {
        ++it;
        continue;
      }
      MoveOrFail(it->first, it->second, "the worker serving this request left", moves);
      inflight_.erase(it++);
    }
    pool_->Remove(w);
    if (options_.metrics != nullptr) options_.metrics->RemoveWorker(name);
  }
  for (const auto& [name, e] : wanted) {
    if (active.contains(name)) continue;
    LOG(INFO) << "kvserve-router: discovered worker " << name;
    pool_->Add(*e);
  }
  PlaceMoves(moves);
}

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
  if (options_.max_inflight_per_worker > 0) return options_.max_inflight_per_worker;
  const pb::WorkerStatus* st = pool_->status(w);
  return st != nullptr ? std::max(0, st->max_num_seqs()) : 0;
}

void RouterCore::PublishInfo(const std::vector<WorkerView>& views) {
  KVSERVE_CHECK_THREAD(core_thread_);
  std::vector<WorkerInfo> info;
  absl::flat_hash_map<int, Load> inflight = InflightLoad();
  for (const WorkerView& v : views) {
    WorkerInfo w;
    w.id = v.id;
    w.name = v.name;
    w.eligible = v.eligible;
    const WorkerPool::Counters c = pool_->counters(v.id);
    w.load_blocks = inflight[v.id].blocks;
    w.inflight_requests = inflight[v.id].requests;
    w.inflight_limit = InflightLimit(v.id);
    w.index_blocks = static_cast<int64_t>(index_.num_blocks(v.id));
    w.event_batches = c.event_batches;
    w.event_gaps = c.gaps;
    w.event_joins = c.joins;
    w.snapshots = c.snapshots;
    if (options_.metrics != nullptr) {
      options_.metrics->SetWorker(v.name, {.load_blocks = w.load_blocks,
                                           .index_blocks = w.index_blocks,
                                           .event_batches = c.event_batches,
                                           .gaps = c.gaps,
                                           .joins = c.joins,
                                           .snapshots = c.snapshots,
                                           .dropped = c.dropped,
                                           .index_evictions = index_.evictions(v.id),
                                           .event_lag_s = c.last_event_lag_s,
                                           .inflight_requests = w.inflight_requests});
    }
    if (const pb::WorkerStatus* st = pool_->status(v.id)) {
      w.state = pb::WorkerState_Name(st->state());
      w.load = st->load();
      w.num_running = st->num_running();
      w.num_waiting = st->num_waiting();
      w.instance_id = st->instance_id();
      int64_t pool_blocks = 0;
      for (const pb::BlockCounts& b : st->blocks()) pool_blocks += std::max<int64_t>(0, b.total());
      index_.SetCapacity(v.id, static_cast<size_t>(pool_blocks));
      for (const pb::BlockCounts& b : st->blocks()) {
        if (b.medium() != pb::MEDIUM_DEVICE) continue;
        w.device_blocks_total = b.total();
        w.device_blocks_active = b.active();
        w.device_blocks_cached = b.cached_evictable();
      }
    } else {
      w.state = "UNKNOWN";
    }
    info.push_back(std::move(w));
  }
  absl::MutexLock lock(&info_mu_);
  info_ = std::move(info);
}

void RouterCore::Place(const std::shared_ptr<Job>& job, int attempts, int exclude) {
  KVSERVE_CHECK_THREAD(core_thread_);
  Move move{.job = job, .attempts = attempts, .from = exclude};
  // A new request waits behind those already waiting; one that moves came before them.
  const bool moves = attempts > 1;
  if (!queue_.empty() && !moves) return Enqueue(std::move(move), /*front=*/false);
  const Placement placed = TryPlace(job, attempts, exclude);
  if (placed == Placement::kFull) return Enqueue(std::move(move), moves);
  // The router's own time from the request's last byte to its worker (waits in the queue and
  // moves are not the router's overhead, so only a first placement at once counts).
  if (placed != Placement::kPlaced || moves || options_.metrics == nullptr) return;
  options_.metrics->ObserveQueueWait(0);  // quantiles of the wait cover every request
  if (job->received != std::chrono::steady_clock::time_point()) {
    options_.metrics->ObserveAdded(
        "to_worker",
        std::chrono::duration<double>(std::chrono::steady_clock::now() - job->received).count());
  }
}

void RouterCore::Enqueue(Move move, bool front) {
  KVSERVE_CHECK_THREAD(core_thread_);
  if (static_cast<int>(queue_.size()) >= options_.max_queued) {
    if (options_.metrics != nullptr) options_.metrics->CountRejected("queue_full");
    move.job->on_response(ErrorResponse(
        move.job->request.request_id(), absl::StatusCode::kResourceExhausted,
        absl::StrCat("the router is at capacity: ", queue_.size(),
                     " requests wait for a worker (--max-queued-requests); retry later")));
    return;
  }
  Waiting w{std::move(move), std::chrono::steady_clock::now()};
  if (front) {
    queue_.push_front(std::move(w));
  } else {
    queue_.push_back(std::move(w));
  }
  queued_ = static_cast<int>(queue_.size());
  if (options_.metrics != nullptr) options_.metrics->SetQueueDepth(queued_);
}

void RouterCore::PlaceQueued() {
  KVSERVE_CHECK_THREAD(core_thread_);
  if (queue_.empty()) return;
  while (!queue_.empty()) {
    const Waiting& w = queue_.front();
    if (TryPlace(w.move.job, w.move.attempts, w.move.from) == Placement::kFull) break;
    if (options_.metrics != nullptr) {
      options_.metrics->ObserveQueueWait(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - w.since).count());
    }
    queue_.pop_front();
  }
  queued_ = static_cast<int>(queue_.size());
  if (options_.metrics != nullptr) options_.metrics->SetQueueDepth(queued_);
}

void RouterCore::ExpireWaits() {
  KVSERVE_CHECK_THREAD(core_thread_);
  const auto now = std::chrono::steady_clock::now();
  const auto max_wait =
      std::chrono::milliseconds(absl::ToInt64Milliseconds(options_.max_queue_wait));
  const auto expire = [&](Job& job, absl::StatusCode code, const char* reason,
                          absl::string_view why) {
    if (options_.metrics != nullptr) options_.metrics->CountRejected(reason);
    job.on_response(ErrorResponse(job.request.request_id(), code, why));
  };
  constexpr absl::string_view kDeadline =
      "the request did not finish within its deadline (--request-timeout-seconds, or the "
      "X-Request-Timeout header)";
  for (auto it = queue_.begin(); it != queue_.end();) {
    Job& job = *it->move.job;
    if (now >= job.deadline) {
      expire(job, absl::StatusCode::kDeadlineExceeded, "deadline", kDeadline);
    } else if (now - it->since >= max_wait) {
      expire(job, absl::StatusCode::kResourceExhausted, "queue_timeout",
             absl::StrCat("no worker had room for the request within ",
                          absl::FormatDuration(options_.max_queue_wait),
                          " (--max-queue-wait-seconds); retry later"));
    } else {
      ++it;
      continue;
    }
    it = queue_.erase(it);
  }
  queued_ = static_cast<int>(queue_.size());
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
    expire(*p.job, absl::StatusCode::kDeadlineExceeded, "deadline", kDeadline);
    inflight_.erase(it++);
  }
}

RouterCore::Placement RouterCore::TryPlace(const std::shared_ptr<Job>& job, int attempts,
                                           int exclude) {
  KVSERVE_CHECK_THREAD(core_thread_);
  std::vector<WorkerView> views = pool_->Views();
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
    if (job->pick && !Pickable(*job->pick, v)) v.eligible = false;
    v.active_blocks = load[v.id].blocks;
    v.queued_prefill_tokens = load[v.id].prefill_tokens;
    v.decode_seqs = load[v.id].decode_seqs;
    ready = ready || v.eligible;
    const int limit = InflightLimit(v.id);
    const Load& l = load[v.id];
    const int n = std::max(1, job->request.sampling().n());
    if (limit > 0 && l.sequences > 0 && l.sequences + n > limit) v.eligible = false;
    room = room || v.eligible;
  }
  if ((ready || unheard) && !room) return Placement::kFull;
  // Prompt block hashes with the cache key the (first eligible) worker advertises.
  std::vector<BlockHash> hashes;
  for (const WorkerView& v : views) {
    if (!v.eligible) continue;
    absl::StatusOr<std::string> key = pool_->ExtraKey(v.id, job->request.cache_salt());
    if (!key.ok()) break;
    std::vector<uint32_t> ids(job->request.prompt_token_ids().begin(),
                              job->request.prompt_token_ids().end());
    hashes = HashFullBlocks(ids, pool_->status(v.id)->block_size(), *key);
    break;
  }
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
    job->on_response(ErrorResponse(id, d.status().code(), d.status().message()));
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
  } else if (prefill = MaybeDisaggregate(*job, hashes, d->worker, &prefill_first);
             !prefill.empty()) {
    // Sent once its prefill ended and its worker has the prefill worker's blocks (StartDecodes).
  } else if (fetch = MaybeFetch(*job, views, hashes, d->worker); fetch != 0) {
    // Sent once its worker has the peer's blocks (SendFetched).
  } else if (absl::Status s = pool_->Send(d->worker, job->request); !s.ok()) {
    job->on_response(ErrorResponse(id, absl::StatusCode::kUnavailable, s.message()));
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
