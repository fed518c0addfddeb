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

void Books::Erase(const std::string& request_id) { placed_.erase(request_id); }

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

absl::flat_hash_map<int, Load> Books::LoadByWorker(const WorkerPool& pool) const {
  absl::flat_hash_map<int, Load> load;
  for (const auto& [id, placed] : placed_) {
    const kvserve::v1::GenerateRequest& r = placed.job->request;
    const kvserve::v1::WorkerStatus* st = pool.status(placed.worker);
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

}  // namespace kvserve::router
