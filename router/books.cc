#include "router/books.h"

#include <algorithm>

namespace kvserve::router {

Placed* Books::Find(const std::string& request_id) {
  auto it = placed_.find(request_id);
  return it == placed_.end() ? nullptr : &it->second;
}

void Books::Add(const std::string& request_id, Placed placed) {
  placed_[request_id] = std::move(placed);
}

void Books::Erase(const std::string& request_id) {
  auto it = placed_.find(request_id);
  if (it == placed_.end()) return;
  const auto now = std::chrono::steady_clock::now();
  while (!ended_.empty() && now - ended_.front().at > std::chrono::seconds(1)) ended_.pop_front();
  const kvserve::v1::GenerateRequest& r = it->second.job->request;
  if (r.placement() != 0) {
    ended_.push_back(
        {.worker = it->second.worker,
         .placement = r.placement(),
         .at = now,
         .tokens = int64_t{r.prompt_token_ids_size()} + r.max_tokens(),
         .n = std::max(1, r.sampling().n()),
         .prefill_tokens = std::max(0, r.prompt_token_ids_size() - r.predicted_cached_tokens()),
         .started = it->second.started});
  }
  placed_.erase(it);
}

std::vector<std::pair<std::string, Placed>> Books::TakeIf(
    absl::FunctionRef<bool(const Placed&)> take) {
  std::vector<std::pair<std::string, Placed>> taken;
  for (auto it = placed_.begin(); it != placed_.end();) {
    if (!take(it->second)) {
      ++it;
      continue;
    }
    taken.emplace_back(it->first, std::move(it->second));
    placed_.erase(it++);
  }
  return taken;
}

void Books::Number(const WorkerPool& pool, int worker, kvserve::v1::GenerateRequest& request) {
  if (pool.load_report(worker) == nullptr) return;
  request.set_router_id(router_id_);
  request.set_placement(++placements_);
}

namespace {

// The last of this replica's placements `report` counts (0: none).
uint64_t SeenBy(const kvserve::v1::LoadReport& report, const std::string& router_id) {
  for (const kvserve::v1::PlacementsSeen& s : report.seen()) {
    if (s.router_id() == router_id) return s.placement();
  }
  return 0;
}

}  // namespace

bool Books::OthersPlacing(const WorkerPool& pool, std::chrono::steady_clock::time_point now) {
  if (now - others_checked_ < std::chrono::milliseconds(100)) return others_placing_;
  others_checked_ = now;
  others_placing_ = false;
  const int64_t window_ms = std::chrono::milliseconds(kOthersWindow).count();
  for (int w = 0; w < pool.size() && !others_placing_; ++w) {
    const kvserve::v1::LoadReport* report = pool.load_report(w);
    if (report == nullptr) continue;
    const int64_t worker_now = pool.status(w)->timestamp_ms();  // the worker's clock, as at_ms
    for (const kvserve::v1::PlacementsSeen& s : report->seen()) {
      if (s.router_id() != router_id_ && worker_now - s.at_ms() < window_ms) {
        others_placing_ = true;
        break;
      }
    }
  }
  return others_placing_;
}

absl::flat_hash_map<int, Load> Books::LoadByWorker(const WorkerPool& pool) const {
  absl::flat_hash_map<int, Load> load;
  absl::flat_hash_map<int, uint64_t> seen;  // per worker that reports: the last it counts
  for (int w = 0; w < pool.size(); ++w) {
    const kvserve::v1::LoadReport* report = pool.load_report(w);
    if (report == nullptr) continue;
    Load& l = load[w];
    l.blocks = report->reserved_blocks();
    l.prefill_tokens = report->prefill_tokens();
    l.decode_seqs = report->decode_seqs();
    seen[w] = SeenBy(*report, router_id_);
  }
  // What a report made before one of this replica's requests ended still counts of it.
  for (const Ended& e : ended_) {
    auto reported = seen.find(e.worker);
    if (reported == seen.end() || e.placement > reported->second ||
        pool.heard_at(e.worker) >= e.at) {
      continue;
    }
    const kvserve::v1::WorkerStatus* st = pool.status(e.worker);
    const int bs = std::max(1, st->block_size());
    Load& l = load[e.worker];
    l.blocks = std::max<int64_t>(0, l.blocks - (e.tokens + bs - 1) / bs);
    if (e.started) {
      l.decode_seqs = std::max<int64_t>(0, l.decode_seqs - e.n);
    } else {
      l.prefill_tokens = std::max<int64_t>(0, l.prefill_tokens - e.prefill_tokens);
    }
  }
  for (const auto& [id, placed] : placed_) {
    const kvserve::v1::GenerateRequest& r = placed.job->request;
    Load& l = load[placed.worker];
    ++l.requests;
    const int n = std::max(1, r.sampling().n());
    l.sequences += n;
    // Counted by its worker's report already: sent, and at or below what the report saw; or an
    // endpoint pick, which the gateway sends to the worker's own front (unnumbered), so that
    // only the reports can count it (from the first one after it arrives).
    auto reported = seen.find(placed.worker);
    if (reported != seen.end() &&
        (placed.job->pick || (r.placement() != 0 && r.placement() <= reported->second))) {
      continue;
    }
    const kvserve::v1::WorkerStatus* st = pool.status(placed.worker);
    const int bs = st != nullptr ? std::max(1, st->block_size()) : 16;
    l.blocks += (r.prompt_token_ids_size() + r.max_tokens() + bs - 1) / bs;
    if (placed.started) {
      l.decode_seqs += n;
    } else {
      l.prefill_tokens +=
          std::max(0, r.prompt_token_ids_size() - static_cast<int>(r.predicted_cached_tokens()));
    }
  }
  return load;
}

}  // namespace kvserve::router
