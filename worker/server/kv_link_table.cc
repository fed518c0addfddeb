#include "worker/server/kv_link_table.h"

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "worker/server/wire.h"

namespace kvserve::worker {
namespace {

namespace pb = ::kvserve::v1;

constexpr absl::Duration kDefaultLinkTimeout = absl::Seconds(30);

pb::KvLinkStatus Failed(uint32_t link_id, const absl::Status& s) {
  pb::KvLinkStatus st;
  st.set_link_id(link_id);
  ToWire(s, st.mutable_error());
  return st;
}

}  // namespace

void KvLinkTable::OnMessage(const ReceivedMessage& m) {
  if (m.type != "KvLinkClose") return Open(m);
  pb::KvLinkClose c;
  if (!ParseMessage(m, &c).ok()) return;
  Erase(m.prefix, c.link_id());
  for (const auto& j : joins_) {
    if (j->router == m.prefix && j->link_id == c.link_id()) j->closed = true;
  }
}

absl::Status KvLinkTable::Refusal(const std::string& router, const pb::KvLinkOpen& open) const {
  const uint32_t id = open.link_id();
  if (maker_.kind.empty()) {
    return absl::UnimplementedError(
        "this worker makes no device-to-device KV links (a CUDA worker with a GPU per rank does)");
  }
  if (id == 0 || open.rank() > 1) {
    return absl::InvalidArgumentError(absl::StrCat("KvLinkOpen: link ", id, " rank ", open.rank(),
                                                   " (a nonzero id, rank 0 or 1)"));
  }
  if (links_.contains({router, id})) {
    return absl::AlreadyExistsError(absl::StrCat("KV link ", id, " is open here already"));
  }
  for (const auto& j : joins_) {
    if (j->router == router && j->link_id == id) {
      return absl::AlreadyExistsError(absl::StrCat("KV link ", id, " is being joined here"));
    }
  }
  return absl::OkStatus();
}

void KvLinkTable::Open(const ReceivedMessage& m) {
  pb::KvLinkOpen open;
  if (absl::Status s = ParseMessage(m, &open); !s.ok()) {
    metrics_->CountDropped("malformed_payload");
    replies_->Send(m.prefix, Failed(0, s));
    return;
  }
  const uint32_t id = open.link_id();
  absl::Status refused = Refusal(m.prefix, open);
  std::string link_key = open.nccl_id();
  if (refused.ok() && open.rank() == 0) {
    absl::StatusOr<std::string> made = maker_.new_key();
    if (made.ok()) {
      link_key = *std::move(made);
      pb::KvLinkStatus st;
      st.set_link_id(id);
      st.set_nccl_id(link_key);
      replies_->Send(m.prefix, st);
    } else {
      refused = made.status();
    }
  }
  if (!refused.ok()) {
    replies_->Send(m.prefix, Failed(id, refused));
    return;
  }
  const absl::Duration timeout =
      open.timeout_ms() > 0 ? absl::Milliseconds(open.timeout_ms()) : kDefaultLinkTimeout;
  auto join = std::make_unique<Join>();
  join->link_id = id;
  join->router = m.prefix;
  Join* j = join.get();
  j->thread = std::thread(
      [j, join_fn = maker_.join, link_key, rank = static_cast<int>(open.rank()), timeout] {
        absl::StatusOr<KvLink> link = join_fn(link_key, rank, timeout);
        absl::MutexLock lock(&j->mu);
        j->result = std::move(link);
        j->done = true;
      });
  joins_.push_back(std::move(join));
}

void KvLinkTable::PollJoins() {
  for (auto it = joins_.begin(); it != joins_.end();) {
    Join& j = **it;
    absl::StatusOr<KvLink> result;
    {
      absl::MutexLock lock(&j.mu);
      if (!j.done) {
        ++it;
        continue;
      }
      result = std::move(j.result);
    }
    if (j.closed) {
      // The router gave up on it while it was joining: dropped unanswered.
    } else if (result.ok()) {
      LOG(INFO) << "KV link " << j.link_id << " joined (" << result->size() << " ranks)";
      links_[{j.router, j.link_id}] = *std::move(result);
      pb::KvLinkStatus st;
      st.set_link_id(j.link_id);
      st.set_ready(true);
      replies_->Send(j.router, st);
    } else {
      replies_->Send(j.router, Failed(j.link_id, result.status()));
      LOG(WARNING) << "KV link " << j.link_id << " not joined: " << result.status();
    }
    it = joins_.erase(it);  // joins the finished thread
  }
}

KvLink* KvLinkTable::Find(const std::string& router, uint32_t link_id) {
  auto it = links_.find({router, link_id});
  return it == links_.end() ? nullptr : &it->second;
}

void KvLinkTable::Drop(const std::string& router, uint32_t link_id, const absl::Status& why) {
  auto it = links_.find({router, link_id});
  if (it == links_.end()) return;
  LOG(WARNING) << "KV link " << link_id << " dropped: " << why;
  replies_->Send(router, Failed(link_id, why));
  Erase(router, link_id);
}

void KvLinkTable::Erase(const std::string& router, uint32_t link_id) {
  on_close_(router, link_id);
  auto it = links_.find({router, link_id});
  if (it == links_.end()) return;
  if (!it->second.empty()) engine_->DropLinkStreams(it->second[0].get());
  links_.erase(it);  // aborts what is still in flight on it
}

}  // namespace kvserve::worker
