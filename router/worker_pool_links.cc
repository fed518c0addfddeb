// WorkerPool's framed links (worker_pool.h, UseLinks): one TCP connection per worker that offers
// one, carrying what its DEALER would, read on the pool's epoll set with the sockets.
#include <sys/epoll.h>

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "router/worker_pool.h"

namespace kvserve::router {
namespace {

namespace pb = ::kvserve::v1;
using Clock = std::chrono::steady_clock;

// Messages a link hands out per turn (as a socket's Drain).
constexpr size_t kMaxLinkMessagesPerTurn = 1024;

// What a worker publishes (on its PUB socket, and on a link that subscribed); everything else a
// link carries answers the router's messages.
bool Published(const std::string& type) {
  return type == "KvEventBatch" || type == "WorkerStatus" || type == "KvSnapshot" ||
         type == "Control";
}

// After a link breaks, the next is tried this long later, doubling per break in a row up to
// 32 s (a worker whose port refuses costs little).
constexpr std::chrono::seconds kLinkRetry{1};
constexpr int kMaxLinkRetryDoublings = 5;  // 32 s

}  // namespace

int WorkerPool::link_epoch(int w) const {
  if (w < 0 || w >= size()) return 0;
  const Worker& worker = workers_[w];
  return worker.link != nullptr && worker.link->connected() ? worker.link_epoch : 0;
}

void WorkerPool::MaybeLink(int w) {
  Worker& worker = workers_[w];
  if (!use_links_ || curve_ || !worker.status) return;
  const uint64_t instance = worker.status->instance_id();
  if (worker.link != nullptr && worker.link_instance != instance) {
    LoseLink(w, absl::UnavailableError("the worker restarted"));
  }
  if (worker.link_instance != instance) worker.link_retry = {};  // a new process: at once
  const int port = worker.status->link_port();
  if (worker.link != nullptr || port <= 0 || Clock::now() < worker.link_retry) return;
  absl::StatusOr<std::unique_ptr<FrameLink>> link =
      FrameLink::Connect(worker.endpoint.host, port, {});
  worker.link_instance = instance;
  if (!link.ok()) {
    LOG_EVERY_T(WARNING, 30) << "worker " << worker.endpoint.name
                             << ": no framed link, its DEALER carries its messages: "
                             << link.status();
    // A host that is a name is not resolved on this thread: never a link (ZeroMQ resolves it).
    worker.link_retry =
        Clock::now() +
        (absl::IsInvalidArgument(link.status())
             ? std::chrono::hours(24)
             : kLinkRetry * (1 << std::min(worker.link_failures, kMaxLinkRetryDoublings)));
    ++worker.link_failures;
    return;
  }
  worker.link = *std::move(link);
  // Its published stream on the link too (queued behind the hello, sent once connected).
  worker.link->Queue(pb::LinkSubscribe()).IgnoreError();
  ++worker.link_epoch;
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLOUT;  // writable: the connect is done (or failed)
  ev.data.u64 = (static_cast<uint64_t>(w) << 2) | kLink;
  PCHECK(epoll_ctl(wait_fd_, EPOLL_CTL_ADD, worker.link->fd(), &ev) == 0) << "epoll_ctl ADD link";
  worker.link_out = true;
}

void WorkerPool::ArmLink(int w) {
  Worker& worker = workers_[w];
  if (worker.link == nullptr || worker.link->wants_write() == worker.link_out) return;
  worker.link_out = worker.link->wants_write();
  epoll_event ev{};
  ev.events = EPOLLIN | (worker.link_out ? EPOLLOUT : 0);
  ev.data.u64 = (static_cast<uint64_t>(w) << 2) | kLink;
  PCHECK(epoll_ctl(wait_fd_, EPOLL_CTL_MOD, worker.link->fd(), &ev) == 0) << "epoll_ctl MOD link";
}

void WorkerPool::LoseLink(int w, const absl::Status& why) {
  Worker& worker = workers_[w];
  LOG_EVERY_T(WARNING, 10) << "worker " << worker.endpoint.name << ": its framed link "
                           << worker.link_epoch << " broke (" << why
                           << "); what was sent on it is lost, its DEALER carries the rest";
  // A link that never connected carried nothing: nothing of it is lost.
  if (!worker.link->connecting()) lost_links_.emplace_back(w, worker.link_epoch);
  if (worker.link_subscribed && worker.sub.socket != nullptr) Subscribe(worker.sub, true);
  worker.link_subscribed = false;
  epoll_event ev{};
  epoll_ctl(wait_fd_, EPOLL_CTL_DEL, worker.link->fd(), &ev);
  worker.link.reset();
  worker.link_out = false;
  ++worker.counters.links_lost;
  ++counters_.links_lost;
  worker.link_retry =
      Clock::now() + kLinkRetry * (1 << std::min(worker.link_failures, kMaxLinkRetryDoublings));
  ++worker.link_failures;
}

void WorkerPool::ServeLink(int w, std::vector<std::pair<int, ReceivedMessage>>& out) {
  Worker& worker = workers_[w];
  // Handling a status may drop this link (a restarted worker's) and make another: `link` says
  // whether it is still the one read.
  const FrameLink* link = worker.link.get();
  absl::Status s = worker.link->Flush();
  std::vector<ReceivedMessage> got;
  if (s.ok()) s = worker.link->Read(got, kMaxLinkMessagesPerTurn);
  if (!got.empty()) worker.link_failures = 0;  // it works
  for (ReceivedMessage& m : got) {
    if (!Published(m.type)) {
      out.emplace_back(w, std::move(m));
      continue;
    }
    if (worker.link.get() == link && !worker.link_subscribed) {  // it carries the stream now
      if (worker.sub.socket != nullptr) Subscribe(worker.sub, false);
      worker.link_subscribed = true;
    }
    QueueSub(w, std::move(m));
  }
  if (worker.link.get() != link) return;
  if (!s.ok()) {
    LoseLink(w, s);
    return;
  }
  ArmLink(w);
}

absl::Status WorkerPool::SendOnLink(int w, absl::FunctionRef<absl::Status(FrameLink&)> queue) {
  Worker& worker = workers_[w];
  if (absl::Status s = queue(*worker.link); !s.ok()) {
    if (absl::IsResourceExhausted(s)) return absl::UnavailableError(s.message());
    if (!worker.link->broken()) return s;  // this message's own fault (too large)
    LoseLink(w, s);
    return absl::UnavailableError(absl::StrCat("worker ", worker.endpoint.name, ": ", s.message()));
  }
  if (absl::Status s = worker.link->Flush(); !s.ok()) {
    LoseLink(w, s);
    return absl::UnavailableError(absl::StrCat("worker ", worker.endpoint.name, ": ", s.message()));
  }
  ArmLink(w);
  return absl::OkStatus();
}

}  // namespace kvserve::router
