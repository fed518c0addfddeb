#include "worker/openai/local_core.h"

#include <algorithm>
#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/net/zmq_framing.h"
#include "glog/logging.h"

namespace kvserve::worker {
namespace {

namespace pb = ::kvserve::v1;
using frontend::ErrorReply;
using frontend::Job;
using frontend::RefusedBeforeRunning;

// The most messages one socket gives a turn of the loop (the rest wait for the next).
constexpr int kMaxMessagesPerTurn = 1024;

void Connect(zmq::socket_t& socket, const std::optional<CurveClientKeys>& curve,
             const std::string& endpoint) {
  socket.set(zmq::sockopt::linger, 0);
  socket.set(zmq::sockopt::ipv6, 1);
  if (curve) {
    // The keys were made at start (and so CURVE found working); this cannot fail after that.
    absl::Status s = MakeCurveClient(socket, curve->own, curve->server_key);
    CHECK(s.ok()) << s;
  }
  socket.connect(endpoint);
}

// Hands `take` the messages waiting on `socket`, up to kMaxMessagesPerTurn (a malformed one is
// dropped).
void DrainSocket(zmq::socket_t& socket, bool with_prefix,
                 const std::function<void(const ReceivedMessage&)>& take) {
  for (int i = 0; i < kMaxMessagesPerTurn; ++i) {
    absl::StatusOr<std::optional<ReceivedMessage>> m =
        ReceiveMessage(socket, with_prefix, zmq::recv_flags::dontwait);
    if (m.ok() && !m->has_value()) return;
    if (m.ok()) take(**m);
  }
}

}  // namespace

LocalCore::LocalCore(const LocalCoreOptions& options)
    : options_(options),
      dealer_(ctx_, zmq::socket_type::dealer),
      sub_(ctx_, zmq::socket_type::sub),
      queue_(options.admission, options.metrics) {
  Connect(dealer_, options.curve, absl::StrCat("tcp://", options.host, ":", options.port));
  sub_.set(zmq::sockopt::subscribe, "status");  // heartbeats; the KV events are the routers'
  Connect(sub_, options.curve, absl::StrCat("tcp://", options.host, ":", options.events_port));
  info_.name = options.name;
  info_.state = "UNKNOWN";
}

LocalCore::~LocalCore() { Stop(); }

void LocalCore::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void LocalCore::Stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void LocalCore::Submit(std::shared_ptr<Job> job) { inbox_.AddJob(std::move(job)); }

void LocalCore::Abort(const std::string& request_id) { inbox_.AddAbort(request_id); }

absl::Status LocalCore::Control(const std::string& worker_name, pb::ControlAction action) {
  if (worker_name != options_.name) {
    return absl::NotFoundError(absl::StrCat("no worker '", worker_name, "'"));
  }
  inbox_.AddControl(0, action);
  return absl::OkStatus();
}

std::vector<frontend::WorkerInfo> LocalCore::Workers() const {
  absl::MutexLock lock(&info_mu_);
  return {info_};
}

void LocalCore::Loop() {
  KVSERVE_CHECK_THREAD(core_thread_);
  const auto place_queued = [this](frontend::AdmissionQueue::Entry& e) {
    KVSERVE_CHECK_THREAD(core_thread_);
    return TryPlace(e.job) != Placement::kFull;
  };
  while (!stop_) {
    frontend::CoreInbox::Taken inbox = inbox_.Take();
    SendControls(inbox.controls);
    queue_.PlaceInOrder(place_queued);  // those waiting came first
    for (const std::shared_ptr<Job>& job : inbox.jobs) Place(job);
    SendAborts(inbox.aborts);
    Poll(inbox.jobs.empty() ? kIdleTurnMs : 0);
    queue_.PlaceInOrder(place_queued);  // finished requests made room
    const Clock::time_point now = Clock::now();
    eligible_ = Ready(now) ? 1 : 0;
    if (now - last_publish_ > std::chrono::milliseconds(50)) {
      queue_.Expire(now);
      ExpireSent(now);
      Publish();
      last_publish_ = now;
    }
    FailLost(now);
  }
}

void LocalCore::Place(const std::shared_ptr<Job>& job) {
  KVSERVE_CHECK_THREAD(core_thread_);
  if (job->pick) {
    job->on_response(ErrorReply(job->request.request_id(), absl::StatusCode::kUnimplemented,
                                "endpoint picks are kvserve-router's (--epp-port); a worker's "
                                "--openai-port serves requests, not picks"));
    return;
  }
  // A new request waits behind those already waiting.
  if (queue_.depth() > 0) return queue_.Push({.job = job}, /*front=*/false);
  const Placement placed = TryPlace(job);
  if (placed == Placement::kFull) return queue_.Push({.job = job}, /*front=*/false);
  if (placed == Placement::kPlaced) queue_.PlacedAtOnce(*job);
}

LocalCore::Placement LocalCore::TryPlace(const std::shared_ptr<Job>& job) {
  KVSERVE_CHECK_THREAD(core_thread_);
  if (!status_) return Placement::kFull;  // not heard from yet: it may be about to take it
  const std::string& id = job->request.request_id();
  const Clock::time_point now = Clock::now();
  if (!Ready(now)) {
    job->on_response(ErrorReply(id, absl::StatusCode::kUnavailable,
                                "no worker is ready (all draining, recycling or unhealthy)"));
    return Placement::kFailed;
  }
  // A worker with nothing in flight takes any request; else only what fits its limit.
  const int n = std::max(1, job->request.sampling().n());
  const int limit = InflightLimit();
  const int sequences = SentSequences();
  if (limit > 0 && sequences > 0 && sequences + n > limit) return Placement::kFull;
  if (absl::Status s = Send(job->request); !s.ok()) {
    job->on_response(ErrorReply(id, absl::StatusCode::kUnavailable, s.message()));
    return Placement::kFailed;
  }
  sent_[id] = Sent{.job = job, .sequences = n, .instance_id = status_->instance_id()};
  return Placement::kPlaced;
}

void LocalCore::SendAborts(const std::vector<std::string>& ids) {
  KVSERVE_CHECK_THREAD(core_thread_);
  for (const std::string& id : ids) {
    if (queue_.Remove(id)) continue;  // still waiting for room
    auto it = sent_.find(id);
    if (it == sent_.end()) continue;  // already ended
    pb::AbortRequest a;
    a.set_request_id(id);
    a.set_reason("client disconnected");
    Send(a).IgnoreError();
    sent_.erase(it);
  }
}

void LocalCore::SendControls(const std::vector<std::pair<int, pb::ControlAction>>& controls) {
  KVSERVE_CHECK_THREAD(core_thread_);
  for (const auto& [worker, action] : controls) {
    pb::Control c;
    c.set_action(action);
    c.set_reason("admin");
    c.set_coordinator_id(options_.coordinator_id);
    Send(c).IgnoreError();
  }
}

void LocalCore::Poll(int timeout_ms) {
  KVSERVE_CHECK_THREAD(core_thread_);
  zmq::pollitem_t items[] = {{dealer_.handle(), 0, ZMQ_POLLIN, 0},
                             {sub_.handle(), 0, ZMQ_POLLIN, 0},
                             {nullptr, inbox_.fd(), ZMQ_POLLIN, 0}};
  try {
    zmq::poll(items, 3, std::chrono::milliseconds(timeout_ms));
  } catch (const zmq::error_t& e) {
    if (e.num() != EINTR) LOG(ERROR) << "kvserve-worker --openai-port: poll: " << e.what();
    return;
  }
  DrainSocket(dealer_, /*with_prefix=*/false, [this](const ReceivedMessage& m) {
    KVSERVE_CHECK_THREAD(core_thread_);  // called back on this thread
    pb::GenerateResponse r;
    if (m.type == "GenerateResponse" && ParseMessage(m, &r).ok()) HandleResponse(r);
  });
  DrainSocket(sub_, /*with_prefix=*/true, [this](const ReceivedMessage& m) {
    KVSERVE_CHECK_THREAD(core_thread_);
    pb::WorkerStatus st;
    if (m.type == "WorkerStatus" && ParseMessage(m, &st).ok()) {
      status_ = std::move(st);
      last_heartbeat_ = Clock::now();
    }
  });
}

void LocalCore::HandleResponse(const pb::GenerateResponse& r) {
  KVSERVE_CHECK_THREAD(core_thread_);
  auto it = sent_.find(r.request_id());
  if (it == sent_.end()) return;  // aborted, or ended already
  Sent& s = it->second;
  if (r.seq() != s.next_seq) {
    LOG_EVERY_T(WARNING, 10) << "kvserve-worker --openai-port: reply " << r.seq() << " to "
                             << it->first << " where " << s.next_seq << " was due";
    return End(
        it, absl::StatusCode::kUnavailable,
        absl::StrCat("replies from the worker were lost on the way (reply ", r.seq(),
                     " came where ", s.next_seq, " was due); the request was stopped, retry it"),
        "replies lost on the link");
  }
  ++s.next_seq;
  if (RefusedBeforeRunning(r)) {
    return End(it, absl::StatusCode::kUnavailable,
               "no worker is ready (all draining, recycling or unhealthy)", nullptr);
  }
  std::shared_ptr<Job> job = s.job;
  if (r.has_usage() || r.finish_reason() == pb::FINISH_REASON_ERROR ||
      r.finish_reason() == pb::FINISH_REASON_ABORT) {
    sent_.erase(it);
  }
  job->on_response(r);
}

void LocalCore::End(absl::flat_hash_map<std::string, Sent>::iterator it, absl::StatusCode code,
                    absl::string_view why, const char* abort) {
  KVSERVE_CHECK_THREAD(core_thread_);
  const std::string id = it->first;
  if (abort != nullptr) {
    pb::AbortRequest a;
    a.set_request_id(id);
    a.set_reason(abort);
    Send(a).IgnoreError();
  }
  std::shared_ptr<Job> job = std::move(it->second.job);
  sent_.erase(it);
  job->on_response(ErrorReply(id, code, why));
}

void LocalCore::ExpireSent(Clock::time_point now) {
  KVSERVE_CHECK_THREAD(core_thread_);
  for (auto it = sent_.begin(); it != sent_.end();) {
    if (now < it->second.job->deadline) {
      ++it;
      continue;
    }
    if (options_.metrics != nullptr) options_.metrics->CountRejected("deadline");
    End(it++, absl::StatusCode::kDeadlineExceeded, frontend::kDeadlineMessage, "deadline passed");
  }
}

void LocalCore::FailLost(Clock::time_point now) {
  KVSERVE_CHECK_THREAD(core_thread_);
  if (!status_ || sent_.empty()) return;  // never heard from it yet: nothing is lost
  const bool silent = !Fresh(now);
  for (auto it = sent_.begin(); it != sent_.end();) {
    // Silent past the heartbeat timeout, or restarted: the new process never heard of it.
    const uint64_t instance = it->second.instance_id;
    if (!silent && (instance == 0 || instance == status_->instance_id())) {
      ++it;
      continue;
    }
    End(it++, absl::StatusCode::kUnavailable, "the worker serving this request stopped responding",
        nullptr);
  }
}

void LocalCore::Publish() {
  KVSERVE_CHECK_THREAD(core_thread_);
  frontend::WorkerInfo w;
  w.name = options_.name;
  w.eligible = eligible_.load() > 0;
  w.inflight_requests = static_cast<int>(sent_.size());
  w.state = "UNKNOWN";
  if (status_) {
    w.inflight_limit = InflightLimit();
    const int bs = std::max(1, status_->block_size());
    for (const auto& [id, s] : sent_) {
      w.load_blocks +=
          (s.job->request.prompt_token_ids_size() + s.job->request.max_tokens() + bs - 1) / bs;
    }
    w.state = pb::WorkerState_Name(status_->state());
    w.load = status_->load();
    w.num_running = status_->num_running();
    w.num_waiting = status_->num_waiting();
    w.instance_id = status_->instance_id();
    for (const pb::BlockCounts& b : status_->blocks()) {
      if (b.medium() != pb::MEDIUM_DEVICE) continue;
      w.device_blocks_total = b.total();
      w.device_blocks_active = b.active();
      w.device_blocks_cached = b.cached_evictable();
    }
  }
  absl::MutexLock lock(&info_mu_);
  info_ = std::move(w);
}

absl::Status LocalCore::Send(const google::protobuf::Message& m) {
  KVSERVE_CHECK_THREAD(core_thread_);
  return SendMessage(dealer_, /*prefix=*/"", m, zmq::send_flags::dontwait);
}

bool LocalCore::Ready(Clock::time_point now) const {
  KVSERVE_CHECK_THREAD(core_thread_);
  return Fresh(now) && status_->state() == pb::WORKER_STATE_READY;
}

int LocalCore::SentSequences() const {
  KVSERVE_CHECK_THREAD(core_thread_);
  int n = 0;
  for (const auto& [id, s] : sent_) n += s.sequences;
  return n;
}

bool LocalCore::Fresh(Clock::time_point now) const {
  KVSERVE_CHECK_THREAD(core_thread_);
  return status_.has_value() &&
         now - last_heartbeat_ <= absl::ToChronoNanoseconds(options_.heartbeat_timeout);
}

int LocalCore::InflightLimit() const {
  KVSERVE_CHECK_THREAD(core_thread_);
  if (options_.admission.max_inflight_per_worker > 0) {
    return options_.admission.max_inflight_per_worker;
  }
  return status_ ? std::max(0, status_->max_num_seqs()) : 0;
}

}  // namespace kvserve::worker
