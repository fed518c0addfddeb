#include "router/router_core.h"

#include <algorithm>
#include <random>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "router/io_turns.h"
#include "router/policies/factory.h"
#include "router/router_metrics.h"

namespace kvserve::router {
namespace {

namespace pb = ::kvserve::v1;
using frontend::RefusedBeforeRunning;

std::unique_ptr<RoutingPolicy> PolicyOrDie(const RoutingConfig& config) {
  absl::StatusOr<std::unique_ptr<RoutingPolicy>> policy = MakeRoutingPolicy(config);
  CHECK(policy.ok()) << policy.status();  // the caller checks the options (kvserve-router does)
  return *std::move(policy);
}

// The id this process numbers its placements under: the replica's, made unique per start (a
// restarted replica numbers from 1 again, below what the workers saw of its last life).
std::string PlacementId(const std::string& router_id) {
  return absl::StrCat(router_id, "/", absl::Hex(std::random_device{}(), absl::kZeroPad8));
}

}  // namespace

RouterCore::RouterCore(const RouterOptions& options)
    : options_(options),
      pool_(std::make_unique<WorkerPool>(ctx_, &index_, options.heartbeat_timeout, options.curve)),
      policy_(PolicyOrDie(options.routing)),
      books_(PlacementId(options.coordinator_id)),
      kv_({.kv_fetch = options.kv_fetch,
           .max_local_prefill_tokens = options.max_local_prefill_tokens,
           .metrics = options.metrics},
          pool_.get(), &index_, &books_, policy_.get()),
      placer_({.admission = options.admission,
               .kv_fetch = options.kv_fetch,
               .metrics = options.metrics},
              pool_.get(), &index_, &books_, &kv_, policy_.get()),
      slots_({options.max_unavailable, options.coordinator_id}, options.heartbeat_timeout) {
  if (options.worker_links) pool_->UseLinks();
  for (const WorkerEndpoint& e : options.workers) pool_->Add(e);
  pool_wait_fd_ = pool_->wait_fd();
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

void RouterCore::StartOn(boost::asio::io_context& io) {
  auto turn = [this] {
    KVSERVE_CHECK_THREAD(core_thread_);
    return Turn(/*wait_ms=*/0);
  };
  const std::vector<int> fds = {pool_wait_fd_, inbox_.fd()};
  io_turns_ = std::make_unique<IoTurns>(io, fds, std::chrono::milliseconds(kIdleTurnMs), turn);
  io_turns_->Start();
  io_turns_started_.store(io_turns_.get(), std::memory_order_release);
}

IoTurns* RouterCore::OnTurnsThread() const {
  IoTurns* turns = io_turns_started_.load(std::memory_order_acquire);
  return turns != nullptr && turns->OnThread() ? turns : nullptr;
}

void RouterCore::Stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  io_turns_started_.store(nullptr, std::memory_order_release);
  if (io_turns_ != nullptr) io_turns_->Stop();  // on io_'s thread, or io_ no longer runs
}

void RouterCore::Submit(std::shared_ptr<Job> job) {
  IoTurns* turns = OnTurnsThread();
  inbox_.AddJob(std::move(job), /*wake=*/turns == nullptr);
  if (turns != nullptr) turns->Soon();
}

void RouterCore::Abort(const std::string& request_id) {
  IoTurns* turns = OnTurnsThread();
  inbox_.AddAbort(request_id, /*wake=*/turns == nullptr);
  if (turns != nullptr) turns->Soon();
}

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
  while (!stop_) Turn(kIdleTurnMs);
}

bool RouterCore::Turn(int wait_ms) {
  KVSERVE_CHECK_THREAD(core_thread_);
  if (discovery_ != nullptr) {
    if (std::optional<std::vector<WorkerEndpoint>> found = discovery_->TakeIfChanged()) {
      SyncWorkers(*found);
    }
  }
  frontend::CoreInbox::Taken inbox = inbox_.Take();
  SendControls(inbox.controls);
  placer_.PlaceQueued();  // those waiting came first
  for (auto& job : inbox.jobs) placer_.Place(job);
  SendAborts(inbox.aborts);
  for (const std::string& id : inbox.started) {
    if (Placed* p = books_.Find(id)) p->started = true;
  }
  // Idle, the loop sleeps until a message or the inbox's wake comes, or its next periodic turn
  // (kIdleTurnMs; it was 5 ms, a quarter of the router's CPU on the Mooncake trace).
  const bool busy = !inbox.jobs.empty() || kv_.in_flight() > 0;
  for (auto& [w, m] : pool_->Poll(busy ? 0 : wait_ms, inbox_.fd())) {
    if (kv_.OnMessage(w, m) || m.type != "GenerateResponse") continue;
    pb::GenerateResponse r;
    if (ParseMessage(m, &r).ok()) HandleResponse(w, r);
  }
  placer_.PlaceQueued();  // finished requests made room
  const std::vector<WorkerView> views = pool_->Views();
  for (KvMovement::Unsent& u : kv_.SendReady(views)) {
    placer_.MoveOrFail(u.request_id, u.placed, u.why);
  }
  placer_.PlaceMoves();
  UpdateReadiness(views);
  if (auto now = std::chrono::steady_clock::now();
      now - last_info_ > std::chrono::milliseconds(50)) {
    ExpireWaits();
    kv_.Refresh(views);
    PublishInfo(views);
    index_.Expire(absl::Now());
    last_info_ = now;
  }
  if (options_.coordinate_recycles) {
    slots_.Turn(*pool_, views);
  } else {
    pool_->TakeRecycleAsks();  // another replica answers them
  }
  RescueLost(views);
  for (const auto& [w, epoch] : pool_->TakeLostLinks()) {
    // The worker is not known to be gone (its next link, or its DEALER, may take them again).
    MoveTaken([&](const Placed& p) { return p.worker == w && p.link_epoch == epoch; },
              "the link to the worker serving this request broke", /*may_return=*/true);
  }
  placer_.PlaceMoves();
  return kv_.in_flight() > 0 || pool_->unread();
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
    const Placed* p = books_.Find(id);
    if (p == nullptr) {  // still waiting for a worker, or already ended
      placer_.Unqueue(id);
      continue;
    }
    if (!p->job->pick) {  // a pick job was never sent: it only leaves the books
      if (const std::string phase = p->prefill; !phase.empty()) {  // its prefill phase stops
        if (const Placed* pre = books_.Find(phase)) {
          StopPlaced(phase, *pre, "client disconnected");
          books_.Erase(phase);
        }
        p = books_.Find(id);
      }
      StopPlaced(id, *p, "client disconnected");
    }
    books_.Erase(id);
  }
}

void RouterCore::StopPlaced(const std::string& request_id, const Placed& p,
                            const std::string& reason) {
  KVSERVE_CHECK_THREAD(core_thread_);
  if (p.fetch != 0 || !p.prefill.empty()) {  // not sent yet: only its fetch stops
    kv_.Cancel(p.fetch);                     // (a prefill phase runs on, its end ignored)
  } else {
    pb::AbortRequest a;
    a.set_request_id(request_id);
    a.set_reason(reason);
    pool_->Send(p.worker, a).IgnoreError();
  }
  index_.ForgetRouted(p.worker, p.hashes);
}

void RouterCore::ExpireWaits() {
  KVSERVE_CHECK_THREAD(core_thread_);
  const auto now = std::chrono::steady_clock::now();
  placer_.ExpireQueued(now);
  for (auto& [id, p] : books_.TakeIf([&](const Placed& p) { return now >= p.job->deadline; })) {
    StopPlaced(id, p, "deadline passed");
    if (options_.metrics != nullptr) options_.metrics->CountRejected("deadline");
    p.job->on_response(
        frontend::ErrorReply(id, absl::StatusCode::kDeadlineExceeded, frontend::kDeadlineMessage));
  }
}

void RouterCore::HandleResponse(int worker, const pb::GenerateResponse& r) {
  KVSERVE_CHECK_THREAD(core_thread_);
  const std::string& id = r.request_id();
  Placed* p = books_.Find(id);
  if (p == nullptr || p->worker != worker) return;  // a moved request's old one
  if (!InSequence(id, *p, r)) {
    books_.Erase(id);
    return;
  }
  if (RefusedBeforeRunning(r) && p->movable()) {
    // The worker refused it before running it (it started draining before it saw the request,
    // or a bridge could not reach its upstream): send it elsewhere.
    placer_.MoveOrFail(id, *p, "");
    books_.Erase(id);
    return placer_.PlaceMoves();
  }
  p->started = true;
  std::shared_ptr<Job> job = p->job;
  const bool failed =
      r.finish_reason() == pb::FINISH_REASON_ERROR || r.finish_reason() == pb::FINISH_REASON_ABORT;
  // A request that failed or was aborted did not leave its blocks cached as assumed.
  if (failed) index_.ForgetRouted(worker, p->hashes);
  if (r.has_usage() || failed) books_.Erase(id);
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

void RouterCore::RescueLost(const std::vector<WorkerView>& views) {
  KVSERVE_CHECK_THREAD(core_thread_);
  MoveTaken(
      [&](const Placed& p) {
        KVSERVE_CHECK_THREAD(core_thread_);  // called back on this thread
        const pb::WorkerStatus* st = pool_->status(p.worker);
        if (st == nullptr) return false;  // never heard from it yet
        // Heard from within the timeout, whether serving or draining on purpose (it finishes
        // what it has): not lost. A stale heartbeat is lost in every state, draining included.
        const bool fresh = std::ranges::any_of(
            views, [&](const WorkerView& v) { return v.id == p.worker && v.fresh; });
        // Restarted (killed and brought back before its heartbeat went stale): the new process
        // never heard of the request.
        return !fresh || (p.instance_id != 0 && st->instance_id() != p.instance_id);
      },
      "the worker serving this request stopped responding");
  placer_.PlaceMoves();
}

void RouterCore::MoveTaken(absl::FunctionRef<bool(const Placed&)> take, absl::string_view why,
                           bool may_return) {
  KVSERVE_CHECK_THREAD(core_thread_);
  for (auto& [id, p] : books_.TakeIf(take)) placer_.MoveOrFail(id, p, why, may_return);
}

void RouterCore::SyncWorkers(const std::vector<WorkerEndpoint>& endpoints) {
  KVSERVE_CHECK_THREAD(core_thread_);
  absl::flat_hash_map<std::string, int> active;
  for (const WorkerView& v : pool_->Views()) active[v.name] = v.id;
  absl::flat_hash_map<std::string, const WorkerEndpoint*> wanted;
  for (const WorkerEndpoint& e : endpoints) wanted[e.name] = &e;
  for (const auto& [name, w] : active) {
    if (wanted.contains(name)) continue;
    LOG(INFO) << "kvserve-router: worker " << name << " left the discovered set";
    MoveTaken([w](const Placed& p) { return p.worker == w; },
              "the worker serving this request left");
    pool_->Remove(w);
    if (options_.metrics != nullptr) options_.metrics->RemoveWorker(name);
  }
  for (const auto& [name, e] : wanted) {
    if (active.contains(name)) continue;
    LOG(INFO) << "kvserve-router: discovered worker " << name;
    pool_->Add(*e);
  }
  placer_.PlaceMoves();
}

void RouterCore::PublishInfo(const std::vector<WorkerView>& views) {
  KVSERVE_CHECK_THREAD(core_thread_);
  std::vector<WorkerInfo> info;
  absl::flat_hash_map<int, Load> inflight = books_.LoadByWorker(*pool_);
  for (const WorkerView& v : views) {
    WorkerInfo w;
    w.id = v.id;
    w.name = v.name;
    w.eligible = v.eligible;
    w.metrics_endpoint = v.metrics_endpoint;
    const WorkerPool::Counters c = pool_->counters(v.id);
    w.load_blocks = inflight[v.id].blocks;
    w.inflight_requests = inflight[v.id].requests;
    w.prefill_tokens = inflight[v.id].prefill_tokens;
    w.decode_seqs = inflight[v.id].decode_seqs;
    w.load_reported = pool_->load_report(v.id) != nullptr;
    w.inflight_limit = placer_.InflightLimit(v.id);
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
                                           .connect_failures = c.connect_failures,
                                           .links_lost = c.links_lost,
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
