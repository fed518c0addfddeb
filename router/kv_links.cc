#include "router/kv_links.h"

#include <algorithm>

#include "glog/logging.h"

namespace kvserve::router {
namespace {

namespace pb = ::kvserve::v1;

// The router's extra wait for a link to become ready, past the workers' join timeout.
constexpr absl::Duration kReadySlack = absl::Seconds(5);

const WorkerView* Find(absl::Span<const WorkerView> views, int id) {
  for (const WorkerView& v : views) {
    if (v.id == id) return &v;
  }
  return nullptr;
}

}  // namespace

bool KvLinks::Linkable(const WorkerView& a, const WorkerView& b) {
  return a.fresh && b.fresh && !a.kv_link.empty() && a.kv_link == b.kv_link &&
         a.tensor_parallel_size == b.tensor_parallel_size && a.kv_wire_block_bytes > 0 &&
         a.kv_wire_block_bytes == b.kv_wire_block_bytes;
}

void KvLinks::Refresh(absl::Span<const WorkerView> views, Clock::time_point now) {
  std::vector<uint32_t> ended;
  for (const auto& [id, l] : links_) {
    const WorkerView* a = Find(views, l.a);
    const WorkerView* b = Find(views, l.b);
    const bool alive = a != nullptr && b != nullptr && Linkable(*a, *b) &&
                       a->instance_id == l.a_instance && b->instance_id == l.b_instance;
    const bool late = l.state != State::kReady &&
                      now - l.opened > absl::ToChronoNanoseconds(timeout_ + kReadySlack);
    if (!alive || late) ended.push_back(id);
  }
  for (uint32_t id : ended) Close(id, now);
  for (size_t i = 0; i < views.size(); ++i) {
    for (size_t j = i + 1; j < views.size(); ++j) {
      const WorkerView& a = views[i].id < views[j].id ? views[i] : views[j];
      const WorkerView& b = views[i].id < views[j].id ? views[j] : views[i];
      const std::pair<int, int> pair{a.id, b.id};
      if (!Linkable(a, b) || by_pair_.contains(pair)) continue;
      if (auto r = retry_at_.find(pair); r != retry_at_.end() && now < r->second) continue;
      const uint32_t id = next_id_++;
      pb::KvLinkOpen open;
      open.set_link_id(id);
      open.set_rank(0);
      open.set_timeout_ms(static_cast<uint32_t>(absl::ToInt64Milliseconds(timeout_)));
      if (!pool_->Send(a.id, open).ok()) continue;
      links_[id] = {.a = a.id,
                    .b = b.id,
                    .a_instance = a.instance_id,
                    .b_instance = b.instance_id,
                    .opened = now};
      by_pair_[pair] = id;
    }
  }
}

void KvLinks::OnStatus(int w, const pb::KvLinkStatus& status, Clock::time_point now) {
  auto it = links_.find(status.link_id());
  if (it == links_.end()) return;
  Link& l = it->second;
  if (w != l.a && w != l.b) return;
  if (status.has_error()) {
    LOG(WARNING) << "KV link " << it->first << " (workers " << l.a << " and " << l.b
                 << ") ended: " << status.error().message();
    Close(it->first, now);
  } else if (!status.nccl_id().empty() && w == l.a && l.state == State::kMaking) {
    pb::KvLinkOpen open;
    open.set_link_id(it->first);
    open.set_rank(1);
    open.set_nccl_id(status.nccl_id());
    open.set_timeout_ms(static_cast<uint32_t>(absl::ToInt64Milliseconds(timeout_)));
    if (!pool_->Send(l.b, open).ok()) {
      Close(it->first, now);
      return;
    }
    l.state = State::kJoining;
  } else if (status.ready()) {
    (w == l.a ? l.a_joined : l.b_joined) = true;
    if (l.a_joined && l.b_joined && l.state == State::kJoining) {
      l.state = State::kReady;
      LOG(INFO) << "KV link " << it->first << " ready between workers " << l.a << " and " << l.b;
    }
  }
}

uint32_t KvLinks::Acquire(int a, int b) {
  auto it = by_pair_.find({std::min(a, b), std::max(a, b)});
  if (it == by_pair_.end()) return 0;
  Link& l = links_.at(it->second);
  if (l.state != State::kReady || l.busy || in_transfer_.contains(a) || in_transfer_.contains(b)) {
    return 0;
  }
  l.busy = true;
  in_transfer_.insert(a);
  in_transfer_.insert(b);
  return it->second;
}

void KvLinks::Release(uint32_t link, bool ok, Clock::time_point now) {
  auto it = links_.find(link);
  if (it == links_.end()) return;
  Link& l = it->second;
  if (l.busy) {
    in_transfer_.erase(l.a);
    in_transfer_.erase(l.b);
    l.busy = false;
  }
  if (!ok) Close(link, now);
}

int KvLinks::ready() const {
  return static_cast<int>(std::count_if(links_.begin(), links_.end(), [](const auto& kv) {
    return kv.second.state == State::kReady;
  }));
}

void KvLinks::Close(uint32_t id, Clock::time_point now) {
  auto it = links_.find(id);
  if (it == links_.end()) return;
  const Link l = it->second;
  pb::KvLinkClose close;
  close.set_link_id(id);
  pool_->Send(l.a, close).IgnoreError();  // a worker gone has dropped it already
  pool_->Send(l.b, close).IgnoreError();
  if (l.busy) {
    in_transfer_.erase(l.a);
    in_transfer_.erase(l.b);
  }
  by_pair_.erase({l.a, l.b});
  retry_at_[{l.a, l.b}] = now + absl::ToChronoNanoseconds(retry_after_);
  links_.erase(it);
}

}  // namespace kvserve::router
