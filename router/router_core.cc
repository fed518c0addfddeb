#include "router/router_core.h"

#include <algorithm>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "router/router_metrics.h"

namespace kvserve::router {
namespace {

namespace pb = ::kvserve::v1;

pb::GenerateResponse ErrorResponse(const std::string& id, absl::StatusCode code,
                                   const std::string& message) {
  pb::GenerateResponse r;
  r.set_request_id(id);
  r.set_finish_reason(pb::FINISH_REASON_ERROR);
  r.mutable_error()->set_code(static_cast<int>(code));
  r.mutable_error()->set_message(message);
  return r;
}

}  // namespace

RouterCore::RouterCore(const RouterOptions& options) : options_(options) {
  pool_ = std::make_unique<WorkerPool>(ctx_, &index_, options.heartbeat_timeout);
  for (const WorkerEndpoint& e : options.workers) pool_->Add(e);
  if (options.workers_dns) {
    discovery_ = std::make_unique<DnsDiscovery>(
        *options.workers_dns, options.dns_refresh,
        options.dns_resolver ? options.dns_resolver : DnsDiscovery::Resolver(ResolveHost));
  }
}

void RouterCore::SyncWorkers(const std::vector<WorkerEndpoint>& endpoints) {
  absl::flat_hash_map<std::string, int> active;
  for (const WorkerView& v : pool_->Views()) active[v.name] = v.id;
  absl::flat_hash_map<std::string, const WorkerEndpoint*> wanted;
  for (const WorkerEndpoint& e : endpoints) wanted[e.name] = &e;
  std::vector<std::pair<std::shared_ptr<Job>, std::pair<int, int>>> moves;
  for (const auto& [name, w] : active) {
    if (wanted.contains(name)) continue;
    std::cout << "kvserve-router: worker " << name << " left the discovered set" << std::endl;
    for (auto it = inflight_.begin(); it != inflight_.end();) {
      if (it->second.worker != w) {
        ++it;
        continue;
      }
      if (!it->second.started && it->second.attempts < 3) {
        moves.push_back({it->second.job, {it->second.attempts + 1, w}});
        ++moved_;
      } else {
        it->second.job->on_response(ErrorResponse(it->first, absl::StatusCode::kUnavailable,
                                                  "the worker serving this request left"));
      }
      inflight_.erase(it++);
    }
    pool_->Remove(w);
  }
  for (const auto& [name, e] : wanted) {
    if (active.contains(name)) continue;
    std::cout << "kvserve-router: discovered worker " << name << std::endl;
    pool_->Add(*e);
  }
  for (auto& [job, how] : moves) Place(job, how.first, how.second);
}

RouterCore::~RouterCore() { Stop(); }

void RouterCore::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void RouterCore::Stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void RouterCore::Submit(std::shared_ptr<Job> job) {
  std::lock_guard<std::mutex> lock(mu_);
  queue_.push_back(std::move(job));
}

void RouterCore::Abort(const std::string& request_id) {
  std::lock_guard<std::mutex> lock(mu_);
  aborts_.push_back(request_id);
}

std::vector<WorkerInfo> RouterCore::Workers() const {
  std::lock_guard<std::mutex> lock(info_mu_);
  return info_;
}

absl::Status RouterCore::Control(const std::string& worker_name, pb::ControlAction action) {
  int id = -1;
  {
    std::lock_guard<std::mutex> lock(info_mu_);  // static and discovered workers alike
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
  std::lock_guard<std::mutex> lock(mu_);
  controls_.emplace_back(id, action);
  return absl::OkStatus();
}

absl::flat_hash_map<int, int64_t> RouterCore::InflightBlocks() const {
  // Each request in flight counts for the blocks it will hold.
  absl::flat_hash_map<int, int64_t> blocks;
  for (const auto& [id, placed] : inflight_) {
    const pb::GenerateRequest& r = placed.job->request;
    const pb::WorkerStatus* st = pool_->status(placed.worker);
    const int bs = st != nullptr ? std::max(1, st->block_size()) : 16;
    blocks[placed.worker] += (r.prompt_token_ids_size() + r.max_tokens() + bs - 1) / bs;
  }
  return blocks;
}

void RouterCore::PublishInfo(const std::vector<WorkerView>& views) {
  std::vector<WorkerInfo> info;
  absl::flat_hash_map<int, int64_t> inflight = InflightBlocks();
  for (const WorkerView& v : views) {
    WorkerInfo w;
    w.id = v.id;
    w.name = v.name;
    w.eligible = v.eligible;
    const WorkerPool::Counters c = pool_->counters(v.id);
    w.load_blocks = inflight[v.id];
    w.index_blocks = static_cast<int64_t>(index_.num_blocks(v.id));
    w.event_batches = c.event_batches;
    w.event_gaps = c.gaps;
    w.snapshots = c.snapshots;
    if (options_.metrics != nullptr) {
      options_.metrics->SetWorker(v.name, {.load_blocks = w.load_blocks,
                                           .index_blocks = w.index_blocks,
                                           .event_batches = c.event_batches,
                                           .gaps = c.gaps,
                                           .snapshots = c.snapshots,
                                           .event_lag_s = c.last_event_lag_s});
    }
    if (const pb::WorkerStatus* st = pool_->status(v.id)) {
      w.state = pb::WorkerState_Name(st->state());
      w.load = st->load();
      w.num_running = st->num_running();
      w.num_waiting = st->num_waiting();
      w.instance_id = st->instance_id();
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
  std::lock_guard<std::mutex> lock(info_mu_);
  info_ = std::move(info);
}

// Grants recycle slots so that at most max_unavailable workers are draining or recycling at
// once, counted from the states the workers themselves publish (so several router replicas
// see the same picture; docs/ROUTER.md explains how their race is closed).
void RouterCore::Coordinate(const std::vector<WorkerView>& views) {
  ResolveGrantConflicts(views);
  auto asks = pool_->TakeRecycleAsks();
  if (asks.empty()) return;
  absl::flat_hash_map<int, std::string> names;
  for (const WorkerView& v : views) names[v.id] = v.name;
  // The lowest-named asker first: replicas that see the same asks grant the same worker.
  std::sort(asks.begin(), asks.end(), [&](const auto& a, const auto& b) {
    return names[std::get<0>(a)] < names[std::get<0>(b)];
  });
  // Unavailable: any worker out of rotation (draining, recycling, restarting, or silent).
  // --max-unavailable 0 turns this replica's coordinator off (it denies every ask).
  int unavailable = 0;
  for (const WorkerView& v : views) unavailable += v.eligible ? 0 : 1;
  for (const auto& [w, instance, reason] : asks) {
    pb::Control reply;
    reply.set_instance_id(instance);
    reply.set_reason(reason);
    reply.set_coordinator_id(options_.coordinator_id);
    if (unavailable < options_.max_unavailable) {
      reply.set_action(pb::CONTROL_ACTION_RECYCLE_GRANT);
      ++unavailable;
      ++grants_;
    } else {
      reply.set_action(pb::CONTROL_ACTION_RECYCLE_DENY);
    }
    pool_->Send(w, reply).IgnoreError();
  }
}

void RouterCore::ResolveGrantConflicts(const std::vector<WorkerView>& views) {
  if (options_.max_unavailable <= 0) return;  // this replica's coordinator is off
  struct Pending {
    int64_t grant_ms;
    std::string name;
    int id;
    uint64_t instance;
  };
  std::vector<Pending> pending;
  int committed = 0;  // out of rotation for good: draining, recycling past the hold, silent
  for (const WorkerView& v : views) {
    const pb::WorkerStatus* st = pool_->status(v.id);
    if (st != nullptr && st->recycle_pending()) {
      pending.push_back({st->recycle_grant_ms(), v.name, v.id, st->instance_id()});
    } else if (!v.eligible) {
      ++committed;
    }
  }
  if (pending.empty()) return;
  // Every replica sees the same heartbeats, so every replica keeps the same grants (earliest
  // first, then by name) and revokes the same others: concurrent grants by different
  // replicas never take more than --max-unavailable workers down.
  std::sort(pending.begin(), pending.end(), [](const Pending& a, const Pending& b) {
    return std::tie(a.grant_ms, a.name) < std::tie(b.grant_ms, b.name);
  });
  const size_t keep = static_cast<size_t>(std::max(0, options_.max_unavailable - committed));
  for (size_t i = keep; i < pending.size(); ++i) {
    const std::string key = absl::StrCat(pending[i].instance, "/", pending[i].grant_ms);
    if (!revoked_.insert(key).second) continue;  // sent already; the worker answers once
    pb::Control revoke;
    revoke.set_action(pb::CONTROL_ACTION_RECYCLE_REVOKE);
    revoke.set_instance_id(pending[i].instance);
    revoke.set_coordinator_id(options_.coordinator_id);
    pool_->Send(pending[i].id, revoke).IgnoreError();
    ++revokes_;
  }
}

void RouterCore::Place(const std::shared_ptr<Job>& job, int attempts, int exclude) {
  std::vector<WorkerView> views = pool_->Views();
  for (WorkerView& v : views) {
    if (v.id == exclude) v.eligible = false;  // the worker that just failed this request
  }
  // Load from the router's own books: heartbeats lag (250 ms), and a worker that just finished
  // a request would look busy.
  absl::flat_hash_map<int, int64_t> inflight_blocks = InflightBlocks();
  for (WorkerView& v : views) v.active_blocks = inflight_blocks[v.id];
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
  absl::StatusOr<Decision> d =
      Route(options_.routing, views, index_, hashes, job->session_key, &round_robin_);
  if (!d.ok()) {
    job->on_response(ErrorResponse(job->request.request_id(), d.status().code(),
                                   std::string(d.status().message())));
    return;
  }
  if (options_.metrics != nullptr) {
    std::string name;
    for (const WorkerView& v : views) {
      if (v.id == d->worker) name = v.name;
    }
    options_.metrics->CountDecision(d->reason, name);
  }
  job->request.set_predicted_cached_tokens(d->predicted_cached_blocks *
                                           std::max(1, pool_->status(d->worker)->block_size()));
  if (absl::Status s = pool_->Send(d->worker, job->request); !s.ok()) {
    job->on_response(ErrorResponse(job->request.request_id(), absl::StatusCode::kUnavailable,
                                   std::string(s.message())));
    return;
  }
  index_.RecordRouted(d->worker, hashes);  // approximate until the worker's events arrive
  const pb::WorkerStatus* st = pool_->status(d->worker);
  inflight_[job->request.request_id()] =
      Placed{d->worker, job, false, attempts, st != nullptr ? st->instance_id() : 0};
}

void RouterCore::Loop() {
  while (!stop_) {
    if (discovery_ != nullptr) {
      if (std::optional<std::vector<WorkerEndpoint>> found = discovery_->TakeIfChanged()) {
        SyncWorkers(*found);
      }
    }
    std::deque<std::shared_ptr<Job>> jobs;
    std::vector<std::string> aborts;
    std::vector<std::pair<int, pb::ControlAction>> controls;
    {
      std::lock_guard<std::mutex> lock(mu_);
      jobs.swap(queue_);
      aborts.swap(aborts_);
      controls.swap(controls_);
    }
    for (const auto& [w, action] : controls) {
      pb::Control c;
      c.set_action(action);
      c.set_reason("admin");
      c.set_coordinator_id(options_.coordinator_id);
      pool_->Send(w, c).IgnoreError();
    }
    for (auto& job : jobs) Place(job);
    for (const std::string& id : aborts) {
      auto it = inflight_.find(id);
      if (it == inflight_.end()) continue;
      pb::AbortRequest a;
      a.set_request_id(id);
      a.set_reason("client disconnected");
      pool_->Send(it->second.worker, a).IgnoreError();
      inflight_.erase(it);
    }
    for (auto& [w, m] : pool_->Poll(jobs.empty() ? 5 : 0)) {
      if (m.type != "GenerateResponse") continue;
      pb::GenerateResponse r;
      if (!ParseMessage(m, &r).ok()) continue;
      auto it = inflight_.find(r.request_id());
      if (it == inflight_.end() || it->second.worker != w)
        continue;  // a moved request's old worker
      if (!it->second.started && r.finish_reason() == pb::FINISH_REASON_ERROR &&
          r.error().code() == static_cast<int>(absl::StatusCode::kFailedPrecondition) &&
          it->second.attempts < 3) {
        // The worker started draining before it saw the request: nothing ran, send it elsewhere.
        std::shared_ptr<Job> job = it->second.job;
        const int attempts = it->second.attempts;
        inflight_.erase(it);
        ++moved_;
        Place(job, attempts + 1, w);
        continue;
      }
      it->second.started = true;
      std::shared_ptr<Job> job = it->second.job;
      const bool last = r.has_usage() || r.finish_reason() == pb::FINISH_REASON_ERROR ||
                        r.finish_reason() == pb::FINISH_REASON_ABORT;
      if (last) inflight_.erase(it);
      if (r.has_usage() && options_.metrics != nullptr) {
        options_.metrics->CountCached(job->request.predicted_cached_tokens(),
                                      r.usage().cached_prompt_tokens());
      }
      job->on_response(r);
    }
    // A worker whose heartbeat stopped: its requests end with an error.
    const std::vector<WorkerView> views = pool_->Views();
    int eligible = 0;
    for (const WorkerView& v : views) eligible += v.eligible ? 1 : 0;
    if (eligible != eligible_.load() || static_cast<int>(views.size()) != known_.load()) {
      // Launchers (kvserve-cluster) and operators read this line.
      std::cout << "kvserve-router: " << eligible << "/" << views.size() << " workers ready"
                << std::endl;
    }
    known_ = static_cast<int>(views.size());
    eligible_ = eligible;
    if (auto now = std::chrono::steady_clock::now();
        now - last_info_ > std::chrono::milliseconds(50)) {
      PublishInfo(views);
      last_info_ = now;
    }
    Coordinate(views);
    std::vector<std::pair<std::shared_ptr<Job>, std::pair<int, int>>>
        moves;  // job, (attempts, from)
    for (auto it = inflight_.begin(); it != inflight_.end();) {
      const Placed& p = it->second;
      const pb::WorkerStatus* st = pool_->status(p.worker);
      if (st == nullptr) {  // never heard from it yet
        ++it;
        continue;
      }
      bool lost = true;
      for (const WorkerView& v : views) {
        // Eligible, or draining on purpose (it finishes what it has): not lost.
        if (v.id == p.worker && (v.eligible || st->state() != pb::WORKER_STATE_READY)) lost = false;
      }
      // Restarted (killed and brought back before its heartbeat went stale): the new process
      // never heard of the request.
      if (p.instance_id != 0 && st->instance_id() != p.instance_id) lost = true;
      if (!lost) {
        ++it;
        continue;
      }
      if (!p.started && p.attempts < 3) {
        moves.push_back(
            {p.job, {p.attempts + 1, p.worker}});  // nothing streamed yet: retry elsewhere
        ++moved_;
      } else {
        p.job->on_response(ErrorResponse(it->first, absl::StatusCode::kUnavailable,
                                         "the worker serving this request stopped responding"));
      }
      inflight_.erase(it++);
    }
    for (auto& [job, how] : moves) Place(job, how.first, how.second);
  }
}

}  // namespace kvserve::router
