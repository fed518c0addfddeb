// WorkerServer: device-to-device KV links (docs/DISAGGREGATION.md). A router's KvLinkOpen makes
// (rank 0: a fresh id, answered at once) and joins a link on a thread of its own, since joining
// waits for the peer; the loop polls the joins and answers each with a KvLinkStatus. A link that
// fails in a transfer is dropped here and the router told; KvLinkClose drops one on the
// router's word. Loop thread, between engine steps.
#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "worker/server/worker_server.h"

namespace kvserve::worker {
namespace {

namespace pb = ::kvserve::v1;

constexpr absl::Duration kDefaultLinkTimeout = absl::Seconds(30);

pb::KvLinkStatus Failed(uint32_t link_id, const absl::Status& s) {
  pb::KvLinkStatus st;
  st.set_link_id(link_id);
  st.mutable_error()->set_code(static_cast<int>(s.code()));
  st.mutable_error()->set_message(std::string(s.message()));
  return st;
}

}  // namespace

void WorkerServer::HandleKvLinkMessage(const ReceivedMessage& m) {
  KVSERVE_CHECK_THREAD(loop_thread_);
  if (m.type == "KvLinkClose") {
    pb::KvLinkClose c;
    if (!ParseMessage(m, &c).ok()) return;
    EraseKvLink(m.prefix, c.link_id());
    for (const auto& j : kv_link_joins_) {
      if (j->router == m.prefix && j->link_id == c.link_id()) j->closed = true;
    }
    return;
  }
  pb::KvLinkOpen open;
  if (absl::Status s = ParseMessage(m, &open); !s.ok()) {
    metrics_->CountDropped("malformed_payload");
    Reply(m.prefix, Failed(0, s));
    return;
  }
  const uint32_t id = open.link_id();
  const KvLinkMaker& maker = options_.kv_links;
  absl::Status refused;
  if (maker.kind.empty()) {
    refused = absl::UnimplementedError(
        "this worker makes no device-to-device KV links (a CUDA worker with a GPU per rank does)");
  } else if (id == 0 || open.rank() > 1) {
    refused = absl::InvalidArgumentError(absl::StrCat("KvLinkOpen: link ", id, " rank ",
                                                      open.rank(), " (a nonzero id, rank 0 or 1)"));
  } else if (kv_links_.contains({m.prefix, id})) {
    refused = absl::AlreadyExistsError(absl::StrCat("KV link ", id, " is open here already"));
  }
  for (const auto& j : kv_link_joins_) {
    if (refused.ok() && j->router == m.prefix && j->link_id == id) {
      refused = absl::AlreadyExistsError(absl::StrCat("KV link ", id, " is being joined here"));
    }
  }
  std::string link_key = open.nccl_id();
  if (refused.ok() && open.rank() == 0) {
    absl::StatusOr<std::string> made = maker.new_key();
    if (made.ok()) {
      link_key = *std::move(made);
      pb::KvLinkStatus st;
      st.set_link_id(id);
      st.set_nccl_id(link_key);
      Reply(m.prefix, st);
    } else {
      refused = made.status();
    }
  }
  if (!refused.ok()) {
    Reply(m.prefix, Failed(id, refused));
    return;
  }
  const absl::Duration timeout =
      open.timeout_ms() > 0 ? absl::Milliseconds(open.timeout_ms()) : kDefaultLinkTimeout;
  auto join = std::make_unique<KvLinkJoin>();
  join->link_id = id;
  join->router = m.prefix;
  KvLinkJoin* j = join.get();
  j->thread = std::thread(
      [j, join_fn = maker.join, link_key, rank = static_cast<int>(open.rank()), timeout] {
        absl::StatusOr<KvLink> link = join_fn(link_key, rank, timeout);
        absl::MutexLock lock(&j->mu);
        j->result = std::move(link);
        j->done = true;
      });
  kv_link_joins_.push_back(std::move(join));
}

void WorkerServer::PollKvLinkJoins() {
  KVSERVE_CHECK_THREAD(loop_thread_);
  for (auto it = kv_link_joins_.begin(); it != kv_link_joins_.end();) {
    KvLinkJoin& j = **it;
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
      kv_links_[{j.router, j.link_id}] = *std::move(result);
      pb::KvLinkStatus st;
      st.set_link_id(j.link_id);
      st.set_ready(true);
      Reply(j.router, st);
    } else {
      Reply(j.router, Failed(j.link_id, result.status()));
      LOG(WARNING) << "KV link " << j.link_id << " not joined: " << result.status();
    }
    it = kv_link_joins_.erase(it);  // joins the finished thread
  }
}

KvLink* WorkerServer::FindKvLink(const std::string& router, uint32_t link_id) {
  KVSERVE_CHECK_THREAD(loop_thread_);
  auto it = kv_links_.find({router, link_id});
  return it == kv_links_.end() ? nullptr : &it->second;
}

void WorkerServer::DropKvLink(const std::string& router, uint32_t link_id,
                              const absl::Status& why) {
  KVSERVE_CHECK_THREAD(loop_thread_);
  auto it = kv_links_.find({router, link_id});
  if (it == kv_links_.end()) return;
  LOG(WARNING) << "KV link " << link_id << " dropped: " << why;
  Reply(router, Failed(link_id, why));
  EraseKvLink(router, link_id);
}

void WorkerServer::EraseKvLink(const std::string& router, uint32_t link_id) {
  KVSERVE_CHECK_THREAD(loop_thread_);
  std::erase_if(stream_asks_, [&](const StreamAsk& a) {
    return a.identity == router && a.req.link_id() == link_id;
  });
  auto it = kv_links_.find({router, link_id});
  if (it == kv_links_.end()) return;
  if (!it->second.empty()) engine_->DropLinkStreams(it->second[0].get());
  kv_links_.erase(it);  // aborts what is still in flight on it
}

}  // namespace kvserve::worker
