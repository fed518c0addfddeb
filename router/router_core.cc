#include "router/router_core.h"

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

void RouterCore::Place(const std::shared_ptr<Job>& job) {
  std::vector<WorkerView> views = pool_->Views();
  // Load from the router's own books: heartbeats lag (250 ms), and a worker that just finished
  // a request would look busy. Each request in flight counts for the blocks it will hold.
  absl::flat_hash_map<int, int64_t> inflight_blocks;
  for (const auto& [id, placed] : inflight_) {
    const pb::GenerateRequest& r = placed.second->request;
    const pb::WorkerStatus* st = pool_->status(placed.first);
    const int bs = st != nullptr ? std::max(1, st->block_size()) : 16;
    inflight_blocks[placed.first] += (r.prompt_token_ids_size() + r.max_tokens() + bs - 1) / bs;
  }
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
  if (options_.metrics != nullptr) options_.metrics->CountDecision(d->reason);
  job->request.set_predicted_cached_tokens(d->predicted_cached_blocks *
                                           std::max(1, pool_->status(d->worker)->block_size()));
  if (absl::Status s = pool_->Send(d->worker, job->request); !s.ok()) {
    job->on_response(ErrorResponse(job->request.request_id(), absl::StatusCode::kUnavailable,
                                   std::string(s.message())));
    return;
  }
  index_.RecordRouted(d->worker, hashes);  // approximate until the worker's events arrive
  inflight_[job->request.request_id()] = {d->worker, job};
}

void RouterCore::Loop() {
  while (!stop_) {
    std::deque<std::shared_ptr<Job>> jobs;
    std::vector<std::string> aborts;
    {
      std::lock_guard<std::mutex> lock(mu_);
      jobs.swap(queue_);
      aborts.swap(aborts_);
    }
    for (auto& job : jobs) Place(job);
    for (const std::string& id : aborts) {
      auto it = inflight_.find(id);
      if (it == inflight_.end()) continue;
      pb::AbortRequest a;
      a.set_request_id(id);
      a.set_reason("client disconnected");
      pool_->Send(it->second.first, a).IgnoreError();
      inflight_.erase(it);
    }
    for (auto& [w, m] : pool_->Poll(jobs.empty() ? 5 : 0)) {
      if (m.type != "GenerateResponse") continue;
      pb::GenerateResponse r;
      if (!ParseMessage(m, &r).ok()) continue;
      auto it = inflight_.find(r.request_id());
      if (it == inflight_.end()) continue;
      std::shared_ptr<Job> job = it->second.second;
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
    bool any = false;
    for (const WorkerView& v : views) any = any || v.eligible;
    ready_ = any;
    for (auto it = inflight_.begin(); it != inflight_.end();) {
      const pb::WorkerStatus* st = pool_->status(it->second.first);
      bool lost = st == nullptr ? false : true;
      for (const WorkerView& v : views) {
        if (v.id == it->second.first && v.eligible) lost = false;
        if (v.id == it->second.first && !v.eligible && st != nullptr &&
            st->state() != pb::WORKER_STATE_READY) {
          lost = false;  // draining: it finishes what it has
        }
      }
      if (lost) {
        it->second.second->on_response(
            ErrorResponse(it->first, absl::StatusCode::kUnavailable,
                          "the worker serving this request stopped responding"));
        inflight_.erase(it++);
      } else {
        ++it;
      }
    }
  }
}

}  // namespace kvserve::router
