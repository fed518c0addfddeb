#include "router/worker_pool.h"

#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/kv/block_hash.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "google/protobuf/arena.h"

namespace kvserve::router {
namespace {

namespace pb = ::kvserve::v1;
using Clock = std::chrono::steady_clock;

// A heartbeat's http_endpoint (or metrics_endpoint) as a gateway dials it: ":port" is on the host
// the router reaches the worker at (an IPv6 address in brackets).
std::string HttpEndpoint(const std::string& worker_host, const std::string& advertised) {
  if (!advertised.starts_with(":")) return advertised;
  const bool v6 = absl::StrContains(worker_host, ':') && !worker_host.starts_with("[");
  return v6 ? absl::StrCat("[", worker_host, "]", advertised) : worker_host + advertised;
}

}  // namespace

WorkerPool::WorkerPool(zmq::context_t& ctx, PrefixIndex* index, absl::Duration heartbeat_timeout,
                       std::optional<CurveClientKeys> curve)
    : ctx_(ctx),
      wait_fd_(epoll_create1(EPOLL_CLOEXEC)),
      index_(index),
      heartbeat_timeout_(heartbeat_timeout),
      curve_(std::move(curve)) {
  PCHECK(wait_fd_ >= 0) << "epoll_create1";
  // ZeroMQ sizes a context's socket table at its first socket (after that this changes nothing).
  zmq_ctx_set(ctx_.handle(), ZMQ_MAX_SOCKETS, zmq_ctx_get(ctx_.handle(), ZMQ_SOCKET_LIMIT));
}

absl::Status WorkerPool::NotConnected(int w) const {
  return absl::UnavailableError(absl::StrCat("worker ", workers_[w].endpoint.name,
                                             " is not connected: its sockets could not be made "
                                             "(the router's open-file limit?)"));
}

WorkerPool::~WorkerPool() { close(wait_fd_); }

void WorkerPool::Watch(const Socket& s, int w, bool is_sub) const {
  if (s.socket == nullptr) return;
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = (static_cast<uint64_t>(w) << 2) | (is_sub ? kSub : kDealer);
  PCHECK(epoll_ctl(wait_fd_, EPOLL_CTL_ADD, s.fd, &ev) == 0) << "epoll_ctl ADD " << s.fd;
}

void WorkerPool::WatchWakeFd(int fd) {
  if (fd == wake_fd_) return;
  epoll_event ev{};
  if (wake_fd_ >= 0) epoll_ctl(wait_fd_, EPOLL_CTL_DEL, wake_fd_, &ev);  // closed since: no matter
  wake_fd_ = fd;
  if (fd < 0) return;
  ev.events = EPOLLIN;
  ev.data.u64 = kWakeTag;
  PCHECK(epoll_ctl(wait_fd_, EPOLL_CTL_ADD, fd, &ev) == 0) << "epoll_ctl ADD " << fd;
}

void WorkerPool::Unwatch(const Socket& s) const {
  if (s.socket == nullptr) return;
  epoll_event ev{};
  PCHECK(epoll_ctl(wait_fd_, EPOLL_CTL_DEL, s.fd, &ev) == 0) << "epoll_ctl DEL " << s.fd;
}

bool WorkerPool::unread() const {
  if (more_ready_) return true;
  const auto unread = [](const Socket& s) { return s.socket != nullptr && s.unread; };
  return std::ranges::any_of(workers_, [&](const Worker& w) {
    return w.active &&
           (unread(w.dealer) || unread(w.sub) || (w.link != nullptr && w.link->has_unread()));
  });
}

void WorkerPool::Secure(zmq::socket_t& socket) const {
  if (!curve_) return;
  // The keys were read (and so CURVE found working) at start; this cannot fail after that.
  absl::Status s = MakeCurveClient(socket, curve_->own, curve_->server_key);
  CHECK(s.ok()) << s;
}

void WorkerPool::Subscribe(Socket& sub, bool on) const {
  for (const char* topic : {"kv", "status", "control"}) {
    if (on) {
      sub.socket->set(zmq::sockopt::subscribe, topic);
    } else {
      sub.socket->set(zmq::sockopt::unsubscribe, topic);
    }
  }
}

void WorkerPool::Connect(int index) {
  Worker& w = workers_[index];
  const WorkerEndpoint& e = w.endpoint;
  Unwatch(w.dealer);
  Unwatch(w.sub);
  w.dealer = {};
  w.sub = {};
  w.connected = Clock::now();  // a failure below is tried again by ReconnectSilent
  auto make = [&](zmq::socket_type type) {
    Socket s;
    s.socket = std::make_unique<zmq::socket_t>(ctx_, type);
    s.socket->set(zmq::sockopt::linger, 0);
    s.socket->set(zmq::sockopt::ipv6, 1);  // discovered workers may have IPv6 addresses
    // A refused connection is tried again after 0.1 s, doubling to 2 s (ZeroMQ's default keeps
    // 0.1 s: 1,024 unreachable workers cost the router half a core).
    s.socket->set(zmq::sockopt::reconnect_ivl_max, 2000);
    Secure(*s.socket);
    s.fd = s.socket->get(zmq::sockopt::fd);
    return s;
  };
  try {
    Socket dealer = make(zmq::socket_type::dealer);
    dealer.socket->connect(absl::StrCat("tcp://", e.host, ":", e.port));
    Socket sub = make(zmq::socket_type::sub);
    sub.socket->set(zmq::sockopt::rcvhwm, 0);
    if (!w.link_subscribed) Subscribe(sub, true);
    sub.socket->connect(absl::StrCat("tcp://", e.host, ":", e.events_port));
    w.dealer = std::move(dealer);
    w.sub = std::move(sub);
  } catch (const zmq::error_t& error) {
    // Out of sockets or descriptors (two sockets and ~4 descriptors a worker), or an endpoint
    // ZeroMQ refuses: this worker stays unconnected, the others are served.
    ++counters_.connect_failures;
    ++w.counters.connect_failures;
    LOG_EVERY_T(ERROR, 10) << "cannot connect to worker " << e.name << " (" << e.host << ":"
                           << e.port << ", events " << e.events_port << "): " << error.what()
                           << " (with " << workers_.size()
                           << " workers; see ulimit -n); trying again in a few seconds";
    return;
  }
  Watch(w.dealer, index, /*is_sub=*/false);
  Watch(w.sub, index, /*is_sub=*/true);
}

int WorkerPool::Add(const WorkerEndpoint& e) {
  Worker& w = workers_.emplace_back();
  w.endpoint = e;
  Connect(size() - 1);
  RefreshView(size() - 1);
  return size() - 1;
}

void WorkerPool::ReconnectSilent() {
  const auto now = Clock::now();
  const auto after = std::max<Clock::duration>(
      std::chrono::seconds(5),
      2 * std::chrono::milliseconds(absl::ToInt64Milliseconds(heartbeat_timeout_)));
  for (int w = 0; w < static_cast<int>(workers_.size()); ++w) {
    Worker& worker = workers_[w];
    // Each silent reconnect doubles the wait, to 8x: a fleet's dead endpoints cost little.
    const auto wait = after * (1 << std::min(worker.silent_reconnects, 3));
    if (!worker.active || now - std::max(worker.last_heartbeat, worker.connected) < wait) continue;
    LOG_EVERY_T(WARNING, 30) << "no heartbeat from worker " << worker.endpoint.name
                             << ": connecting again (a worker that refuses this router's CURVE "
                                "key looks the same: see its kvserve_zmq_authentications_total)";
    ++worker.counters.reconnects;
    ++worker.silent_reconnects;
    Connect(w);
  }
}

void WorkerPool::Remove(int w) {
  if (workers_[w].link != nullptr) {
    epoll_event ev{};
    epoll_ctl(wait_fd_, EPOLL_CTL_DEL, workers_[w].link->fd(), &ev);
    workers_[w].link.reset();
  }
  workers_[w].active = false;
  Unwatch(workers_[w].dealer);
  Unwatch(workers_[w].sub);
  workers_[w].dealer = {};
  workers_[w].sub = {};
  index_->RemoveWorker(w);
}

absl::Status WorkerPool::Send(int w, const google::protobuf::Message& message) {
  if (w < 0 || w >= static_cast<int>(workers_.size()) || !workers_[w].active) {
    return absl::NotFoundError(absl::StrCat("no worker ", w));
  }
  if (link_epoch(w) != 0) {
    return SendOnLink(w, [&](FrameLink& link) { return link.Queue(message); });
  }
  if (workers_[w].dealer.socket == nullptr) return NotConnected(w);
  // A send may take the signal of a message that arrived meanwhile (ZeroMQ's ZMQ_FD contract).
  workers_[w].dealer.unread = true;
  return SendMessage(*workers_[w].dealer.socket, "", message, zmq::send_flags::dontwait);
}

absl::Status WorkerPool::Forward(int w, const ReceivedMessage& m) {
  if (w < 0 || w >= static_cast<int>(workers_.size()) || !workers_[w].active) {
    return absl::NotFoundError(absl::StrCat("no worker ", w));
  }
  if (link_epoch(w) != 0) {
    return SendOnLink(w, [&](FrameLink& link) { return link.Queue(m.type, m.payload); });
  }
  if (workers_[w].dealer.socket == nullptr) return NotConnected(w);
  workers_[w].dealer.unread = true;
  const std::string_view frames[] = {m.type, m.payload};
  return SendFrames(*workers_[w].dealer.socket, frames, zmq::send_flags::dontwait);
}

namespace {

constexpr int kMaxBlockSize = 1024;

// Whether a heartbeat's values are ones a worker can have: the router hashes prompts with its
// block size and sizes its books with the rest, so an impossible value is dropped, not used.
absl::Status CheckStatus(const pb::WorkerStatus& st) {
  if (st.block_size() < 1 || st.block_size() > kMaxBlockSize) {
    return absl::InvalidArgumentError(absl::StrCat("block_size ", st.block_size()));
  }
  if (st.tensor_parallel_size() < 0 || st.tensor_parallel_size() > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor_parallel_size ", st.tensor_parallel_size()));
  }
  if (st.num_running() < 0 || st.num_waiting() < 0 || st.num_swapped() < 0) {
    return absl::InvalidArgumentError("negative request counts");
  }
  // The KV fetch's cost inputs (router/kv_fetch.h): a block of at most 1 GiB, a finite rate.
  if (st.kv_wire_block_bytes() < 0 || st.kv_wire_block_bytes() > (int64_t{1} << 30) ||
      !std::isfinite(st.prefill_tokens_per_second()) || st.prefill_tokens_per_second() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("kv_wire_block_bytes ", st.kv_wire_block_bytes(),
                                                   ", prefill_tokens_per_second ",
                                                   st.prefill_tokens_per_second()));
  }
  return absl::OkStatus();
}

}  // namespace

void WorkerPool::HandleSub(int w, const ReceivedMessage& m) {
  CountIfDropped(workers_[w], w, ApplySub(workers_[w], w, m));
}

void WorkerPool::CountIfDropped(Worker& worker, int w, const absl::Status& s) {
  if (s.ok()) return;
  ++worker.counters.dropped;
  LOG_EVERY_T(WARNING, 10) << "dropped a message from worker " << w << ": " << s;
}

absl::Status WorkerPool::InstallSnapshot(Worker& worker, int w, BuiltSnapshot built) {
  RETURN_IF_ERROR(built.table.status());
  ++counters_.snapshots;
  ++worker.counters.snapshots;
  index_->InstallSnapshot(w, *std::move(built.table));
  return absl::OkStatus();
}

void WorkerPool::FlushSub() {
  if (pending_snapshots_ == 0) {  // every turn: heartbeats, events and reports in order
    for (const auto& [w, m] : pending_sub_) HandleSub(w, m);
    pending_sub_.clear();
    return;
  }
  std::vector<SnapshotJob> jobs;
  for (const auto& [w, m] : pending_sub_) {
    if (m.type == "KvSnapshot") jobs.push_back({w, m.payload, index_->capacity(w)});
  }
  // The index is untouched while they build: capacities are only set between turns.
  std::vector<BuiltSnapshot> built = BuildSnapshots(jobs, snapshot_threads_);
  size_t next = 0;
  for (const auto& [w, m] : pending_sub_) {
    if (m.type == "KvSnapshot") {
      CountIfDropped(workers_[w], w, InstallSnapshot(workers_[w], w, std::move(built[next++])));
    } else {
      HandleSub(w, m);
    }
  }
  pending_sub_.clear();
  pending_snapshots_ = 0;
}

void WorkerPool::AskSnapshot(Worker& worker, int w) {
  pb::Control ask;
  ask.set_action(pb::CONTROL_ACTION_SNAPSHOT_REQUEST);
  Send(w, ask).IgnoreError();
  worker.snapshot_asked = Clock::now();
}

absl::Status WorkerPool::ApplySub(Worker& worker, int w, const ReceivedMessage& m) {
  if (m.type == "WorkerStatus") {
    pb::WorkerStatus st;
    RETURN_IF_ERROR(ParseMessage(m, &st));
    RETURN_IF_ERROR(CheckStatus(st));
    if (index_->SeeInstance(w, st.instance_id())) {  // restarted: resync from a snapshot
      AskSnapshot(worker, w);
    } else if (!index_->synced(w) && st.kv_event_seq() > index_->last_seq(w) &&
               Clock::now() - worker.snapshot_asked > kSnapshotRetry) {
      // A router that starts after a worker published its events would hear none of them
      // until the worker's next change (an idle worker's cache stayed unknown): a heartbeat
      // reporting batches this index has not seen asks for a snapshot.
      AskSnapshot(worker, w);
    }
    worker.status = std::move(st);
    worker.last_heartbeat = Clock::now();
    worker.silent_reconnects = 0;
    RefreshView(w);
    MaybeLink(w);
  } else if (m.type == "KvEventBatch") {
    // A batch holds a string per block hash: parsed into an arena over a reused block, it costs
    // no allocation (the heap was a fifth of the router's time with 4K-token prompts).
    google::protobuf::ArenaOptions arena_options;
    arena_options.initial_block = event_arena_block_.data();
    arena_options.initial_block_size = event_arena_block_.size();
    google::protobuf::Arena arena(arena_options);
    pb::KvEventBatch& batch = *google::protobuf::Arena::CreateMessage<pb::KvEventBatch>(&arena);
    RETURN_IF_ERROR(ParseMessage(m, &batch));
    ++counters_.event_batches;
    ++worker.counters.event_batches;
    if (batch.timestamp_ms() > 0) {
      const int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                 std::chrono::system_clock::now().time_since_epoch())
                                 .count();
      worker.counters.last_event_lag_s = std::max<int64_t>(0, now_ms - batch.timestamp_ms()) / 1e3;
      counters_.last_event_lag_s = worker.counters.last_event_lag_s;
    }
    switch (index_->ApplyEvents(w, batch)) {
      case PrefixIndex::Apply::kGap:
        ++counters_.gaps;
        ++worker.counters.gaps;
        AskSnapshot(worker, w);
        break;
      case PrefixIndex::Apply::kJoined:  // expected once per worker a router starts with
        ++counters_.joins;
        ++worker.counters.joins;
        AskSnapshot(worker, w);
        break;
      case PrefixIndex::Apply::kAwaitingSnapshot:  // asked already; again if it was lost
        if (Clock::now() - worker.snapshot_asked > kSnapshotRetry) AskSnapshot(worker, w);
        break;
      default:
        break;
    }
  } else if (m.type == "KvSnapshot") {  // as FlushSub handles them, one at a time
    const SnapshotJob job{w, m.payload, index_->capacity(w)};
    return InstallSnapshot(worker, w, std::move(BuildSnapshots({&job, 1}, 1)[0]));
  } else if (m.type == "Control") {
    pb::Control c;
    RETURN_IF_ERROR(ParseMessage(m, &c));
    if (c.action() != pb::CONTROL_ACTION_RECYCLE_REQUEST) {
      return absl::InvalidArgumentError(absl::StrCat("control action ", c.action()));
    }
    ++counters_.recycle_asks;
    recycle_asks_.emplace_back(w, c.instance_id(), c.reason());
  } else {
    return absl::InvalidArgumentError(absl::StrCat("unknown message type ", m.type));
  }
  return absl::OkStatus();
}

WorkerPool::Counters WorkerPool::counters(int w) const {
  if (w < 0 || w >= static_cast<int>(workers_.size())) return {};
  return workers_[w].counters;
}

// The sockets that signalled come from wait_fd_'s epoll set (as many as are ready, not one
// pollfd per socket: a poll(2) over every socket's descriptor took 120 us a turn at 1,024
// workers, worker_views_bench's BM_PollIdle), then every socket that may hold unsignalled
// messages is drained too. zmq_poll, before that, asked every socket for its events, which
// ZeroMQ answers with a poll(2) and a getpid(2) of its own (docs/ROUTING.md, "Router CPU per
// request").
std::vector<std::pair<int, ReceivedMessage>> WorkerPool::Poll(int timeout_ms, int wake_fd) {
  ReconnectSilent();
  std::vector<std::pair<int, ReceivedMessage>> out;
  const bool wait = timeout_ms != 0 && !unread();
  if (wait) WatchWakeFd(wake_fd);  // one epoll_wait for the sockets and the caller's wake-up
  std::array<epoll_event, kMaxReadyPerTurn> ready;
  const int n = epoll_wait(wait_fd_, ready.data(), ready.size(), wait ? timeout_ms : 0);
  if (n < 0 && errno != EINTR) PLOG(WARNING) << "epoll_wait";
  more_ready_ = n == static_cast<int>(ready.size());  // the rest next turn, without waiting
  for (int i = 0; i < n; ++i) {
    if (ready[i].data.u64 == kWakeTag) continue;  // the caller reads its own descriptor
    const int w = static_cast<int>(ready[i].data.u64 >> 2);
    const uint64_t kind = ready[i].data.u64 & 3;
    if (w >= size() || !workers_[w].active) continue;  // removed since
    if (kind == kLink) {
      if (workers_[w].link != nullptr) ServeLink(w, out);
      continue;
    }
    const bool is_sub = kind == kSub;
    if ((is_sub ? workers_[w].sub : workers_[w].dealer).socket != nullptr) Drain(w, is_sub, out);
  }
  for (int w = 0; w < size(); ++w) {  // sent on since, or a drain cut short
    if (!workers_[w].active) continue;
    if (workers_[w].link != nullptr && workers_[w].link->has_unread()) ServeLink(w, out);
    for (const bool is_sub : {false, true}) {
      const Socket& s = is_sub ? workers_[w].sub : workers_[w].dealer;
      if (s.socket != nullptr && s.unread) Drain(w, is_sub, out);
    }
  }
  FlushSub();
  return out;
}

void WorkerPool::Drain(int w, bool is_sub, std::vector<std::pair<int, ReceivedMessage>>& out) {
  Socket& s = is_sub ? workers_[w].sub : workers_[w].dealer;
  s.unread = true;  // until a receive finds nothing left
  for (int k = 0; k < 1024 && workers_[w].active; ++k) {
    auto m = ReceiveMessage(*s.socket, /*with_prefix=*/is_sub, zmq::recv_flags::dontwait);
    if (!m.ok()) {  // malformed: dropped
      ++workers_[w].counters.dropped;
      continue;
    }
    if (!m->has_value()) {
      s.unread = false;
      return;
    }
    if (is_sub) {
      QueueSub(w, std::move(**m));
    } else {
      out.emplace_back(w, std::move(**m));
    }
  }
}

void WorkerPool::QueueSub(int w, ReceivedMessage m) {
  if (m.type == "KvSnapshot") ++pending_snapshots_;
  pending_sub_.emplace_back(w, std::move(m));
  if (pending_snapshots_ >= kMaxPendingSnapshots) FlushSub();
}

void WorkerPool::RefreshView(int w) {
  Worker& worker = workers_[w];
  WorkerView v;
  v.id = w;
  v.name = worker.endpoint.name;
  if (worker.status) {
    for (const pb::BlockCounts& b : worker.status->blocks()) {
      if (b.medium() != pb::MEDIUM_DEVICE) continue;
      v.active_blocks = b.active();
      v.capacity_blocks = b.total();
    }
    v.block_size = std::max(1, worker.status->block_size());
    v.waiting = worker.status->num_waiting() + worker.status->num_swapped();
    v.http_endpoint = HttpEndpoint(worker.endpoint.host, worker.status->http_endpoint());
    v.metrics_endpoint = HttpEndpoint(worker.endpoint.host, worker.status->metrics_endpoint());
    v.kv_wire_block_bytes = worker.status->kv_wire_block_bytes();
    v.prefill_tokens_per_second = worker.status->prefill_tokens_per_second();
    v.prefill_only = worker.status->role() == "prefill";
    v.kv_link = worker.status->kv_link();
    v.instance_id = worker.status->instance_id();
    v.tensor_parallel_size = std::max(1, worker.status->tensor_parallel_size());
  }
  worker.view = std::move(v);
}

std::vector<WorkerView> WorkerPool::Views() const {
  std::vector<WorkerView> views;
  views.reserve(workers_.size());
  const auto now = Clock::now();
  const auto timeout = std::chrono::milliseconds(absl::ToInt64Milliseconds(heartbeat_timeout_));
  for (const Worker& worker : workers_) {
    if (!worker.active) continue;
    WorkerView& v = views.emplace_back(worker.view);
    v.fresh = worker.status.has_value() && now - worker.last_heartbeat <= timeout;
    v.eligible = v.fresh && worker.status->state() == pb::WORKER_STATE_READY;
  }
  return views;
}

const pb::WorkerStatus* WorkerPool::status(int w) const {
  if (w < 0 || w >= static_cast<int>(workers_.size()) || !workers_[w].status) return nullptr;
  return &*workers_[w].status;
}

const pb::LoadReport* WorkerPool::load_report(int w) const {
  const pb::WorkerStatus* st = status(w);
  if (st == nullptr || !workers_[w].active || !st->has_load_report()) return nullptr;
  return &st->load_report();
}

absl::StatusOr<std::string> WorkerPool::ExtraKey(int w, std::string_view cache_salt) const {
  const pb::WorkerStatus* st = status(w);
  if (st == nullptr)
    return absl::UnavailableError(absl::StrCat("no heartbeat from worker ", w, " yet"));
  CacheKey key{st->model_id(),
               st->kv_cache_dtype(),
               st->kv_quant(),
               static_cast<uint32_t>(st->block_size()),
               static_cast<uint32_t>(std::max(1, st->tensor_parallel_size())),
               std::string(cache_salt)};
  return key.Serialize();
}

std::vector<std::tuple<int, uint64_t, std::string>> WorkerPool::TakeRecycleAsks() {
  return std::exchange(recycle_asks_, {});
}

}  // namespace kvserve::router
