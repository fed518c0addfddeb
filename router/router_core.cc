#include "router/router_core.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "router/policies/factory.h"
#include "router/recycle_coordinator.h"
#include "router/router_metrics.h"

namespace kvserve::router {
namespace {

namespace pb = ::kvserve::v1;
using frontend::RefusedWhileDraining;

}  // namespace

RouterCore::RouterCore(const RouterOptions& options)
    : options_(options), queue_(options.admission, options.metrics) {
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

RouterCore::~RouterCore() { Stop(); }

void RouterCore::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void RouterCore::Stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void RouterCore::Submit(std::shared_ptr<Job> job) { inbox_.AddJob(std::move(job)); }

void RouterCore::Abort(const std::string& request_id) { inbox_.AddAbort(request_id); }

void RouterCore::Started(const std::string& request_id) { inbox_.AddStarted(request_id); }

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
  inbox_.AddControl(id, action);
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
    frontend::CoreInbox::Taken inbox = inbox_.Take();
    SendControls(inbox.controls);
    PlaceQueued();  // those waiting came first
    for (auto& job : inbox.jobs) Place(job);
    SendAborts(inbox.aborts);
    for (const std::string& id : inbox.started) {
      if (auto it = inflight_.find(id); it != inflight_.end()) it->second.started = true;
    }
    // Idle, the loop sleeps until a message or the inbox's wake comes, or its next periodic turn
    // (kIdleTurnMs; it was 5 ms, a quarter of the router's CPU on the Mooncake trace).
    std::vector<KvFetches::Done> fetched;
    const int wait_ms = inbox.jobs.empty() && fetches_->in_flight() == 0 ? kIdleTurnMs : 0;
    for (auto& [w, m] : pool_->Poll(wait_ms, inbox_.fd())) {
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
      queue_.Remove(id);
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
      fetches_->Cancel(it->second.fetch);  // the phase's stream, if any
    } else if (it->second.fetch != 0) {    // not sent yet: its fetch stops
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
  p.job->on_response(frontend::ErrorReply(
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
  p.job->on_response(frontend::ErrorReply(request_id, absl::StatusCode::kUnavailable, why));
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

}  // namespace kvserve::router
