#include "worker/server/load_reports.h"

#include <algorithm>

namespace kvserve::worker {

void LoadReports::Took(const std::string& router_id, uint64_t placement, int64_t now_ms) {
  if (router_id.empty() || placement == 0) return;
  auto it = seen_.find(router_id);
  if (it == seen_.end()) {
    if (seen_.size() >= kMaxReplicas) {
      seen_.erase(std::min_element(seen_.begin(), seen_.end(), [](const auto& a, const auto& b) {
        return a.second.heard < b.second.heard;
      }));
    }
    it = seen_.emplace(router_id, Seen{}).first;
  }
  if (placement <= it->second.placement) return;
  it->second = {.placement = placement, .heard = ++took_, .at_ms = now_ms};
}

bool LoadReports::Changed(const Engine::Load& load) const {
  return took_ != reported_ || load.prefill_tokens != last_.prefill_tokens ||
         load.decode_seqs != last_.decode_seqs || load.reserved_blocks != last_.reserved_blocks ||
         load.requests != last_.requests || load.waiting != last_.waiting;
}

void LoadReports::Fill(const Engine::Load& load, kvserve::v1::LoadReport* out) {
  out->set_prefill_tokens(load.prefill_tokens);
  out->set_decode_seqs(load.decode_seqs);
  out->set_reserved_blocks(load.reserved_blocks);
  out->set_requests(load.requests);
  out->set_waiting(load.waiting);
  for (const auto& [router_id, seen] : seen_) {
    kvserve::v1::PlacementsSeen* s = out->add_seen();
    s->set_router_id(router_id);
    s->set_placement(seen.placement);
    s->set_at_ms(seen.at_ms);
  }
  last_ = load;
  reported_ = took_;
}

}  // namespace kvserve::worker
