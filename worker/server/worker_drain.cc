// WorkerServer: control actions (drain, undrain, recycle grants and revokes, snapshot requests),
// and the drain they start: no new requests, in-flight ones finished or aborted at the drain
// timeout, a recycle grant held revocable until committed, then the exit.
#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "proto/worker_control.h"
#include "worker/server/process_clock.h"
#include "worker/server/worker_server.h"

namespace kvserve::worker {

namespace pb = ::kvserve::v1;

void WorkerServer::HandleControl(const std::string& identity, const pb::Control& c) {
  KVSERVE_CHECK_THREAD(loop_thread_);
  const auto drain = [this](const pb::Control& control) {
    return ControlDrain(control, /*recycle=*/false);
  };
  const auto recycle = [this](const pb::Control& control) {
    return ControlDrain(control, /*recycle=*/true);
  };
  Reply(
      identity,
      AnswerControl(
          c,
          {{pb::CONTROL_ACTION_DRAIN, drain},
           {pb::CONTROL_ACTION_UNDRAIN, [this](const pb::Control&) { return Undrain(); }},
           {pb::CONTROL_ACTION_RECYCLE_GRANT,
            [this](const pb::Control& control) { return HoldGrant(control); }},
           {pb::CONTROL_ACTION_RECYCLE_REVOKE,
            [this](const pb::Control& control) { return RevokeGrant(control); }},
           {pb::CONTROL_ACTION_RECYCLE, recycle},
           {pb::CONTROL_ACTION_RECYCLE_DENY, [this](const pb::Control&) { return DenyRecycle(); }},
           {pb::CONTROL_ACTION_SNAPSHOT_REQUEST,
            [this](const pb::Control&) { return Snapshot(); }}},
          [this](pb::ControlAction action) {
            metrics_->CountDropped("bad_control_action");
            return absl::InvalidArgumentError(absl::StrCat("unsupported control action ", action));
          }));
}

absl::Status WorkerServer::ControlDrain(const pb::Control& c, bool recycle) {
  KVSERVE_CHECK_THREAD(loop_thread_);
  const std::string fallback = recycle ? "recycle" : "admin";
  StartDrain(c.reason().empty() ? fallback : c.reason(), recycle);
  return absl::OkStatus();
}

absl::Status WorkerServer::Undrain() {
  KVSERVE_CHECK_THREAD(loop_thread_);
  if (recycle_after_drain_ || stop_after_drain_) {
    return absl::FailedPreconditionError("a recycle or shutdown drain cannot be undone");
  }
  draining_ = false;
  state_ = pb::WORKER_STATE_READY;
  return absl::OkStatus();
}

absl::Status WorkerServer::HoldGrant(const pb::Control& c) {
  KVSERVE_CHECK_THREAD(loop_thread_);
  if (c.instance_id() != 0 && c.instance_id() != instance_id_) {
    return absl::FailedPreconditionError("the grant is for an earlier instance of this worker");
  }
  if (draining_) return absl::OkStatus();  // a second replica's grant for the same slot: held
  grant_pending_ = true;
  grant_ms_ = NowMs();
  granted_by_ = c.coordinator_id();
  grant_commit_ = Clock::now() +
                  std::chrono::milliseconds(absl::ToInt64Milliseconds(options_.recycle_grant_hold));
  StartDrain(c.reason().empty() ? "recycle" : c.reason(), /*recycle=*/true);
  return absl::OkStatus();
}

absl::Status WorkerServer::RevokeGrant(const pb::Control& c) {
  KVSERVE_CHECK_THREAD(loop_thread_);
  if (!grant_pending_ || Clock::now() >= grant_commit_) {
    return absl::FailedPreconditionError("no revocable recycle grant (none, or already committed)");
  }
  LOG(INFO) << "recycle grant revoked by " << c.coordinator_id();
  grant_pending_ = false;
  recycle_after_drain_ = false;
  recycle_requested_ = false;  // ask again later
  if (stop_after_drain_) {
    state_ = pb::WORKER_STATE_DRAINING;  // a SIGTERM came meanwhile: keep stopping
  } else {
    draining_ = false;
    state_ = pb::WORKER_STATE_READY;
  }
  PublishStatus();
  return absl::OkStatus();
}

absl::Status WorkerServer::DenyRecycle() {
  KVSERVE_CHECK_THREAD(loop_thread_);
  recycle_requested_ = false;  // ask again later
  return absl::OkStatus();
}

absl::Status WorkerServer::Snapshot() {
  KVSERVE_CHECK_THREAD(loop_thread_);
  kv_events_->PublishSnapshot(*engine_);
  return absl::OkStatus();
}

void WorkerServer::StartDrain(const std::string& reason, bool recycle) {
  KVSERVE_CHECK_THREAD(loop_thread_);
  if (recycle) recycle_after_drain_ = true;
  if (draining_) return;
  draining_ = true;
  drain_reason_ = reason;
  drain_deadline_ =
      Clock::now() + std::chrono::milliseconds(absl::ToInt64Milliseconds(options_.drain_timeout));
  state_ = recycle ? pb::WORKER_STATE_RECYCLING : pb::WORKER_STATE_DRAINING;
  LOG(INFO) << "draining: " << reason;
  PublishStatus();
}

bool WorkerServer::RecycleDue(std::string* reason) {
  KVSERVE_CHECK_THREAD(loop_thread_);
  const RecyclePolicy& p = options_.recycle;
  if (p.after_requests > 0 && served_requests_ >= p.after_requests)
    *reason = "requests";
  else if (p.after_seconds > 0 && Seconds(Clock::now() - started_) >= p.after_seconds)
    *reason = "uptime";
  else if (p.on_rss_growth_mb > 0 && RssMb() - start_rss_mb_ >= p.on_rss_growth_mb)
    *reason = "rss_growth";
  else if (p.on_fragmentation > 0) {
    const Engine::KvUsage u = engine_->kv_usage();
    if (u.allocated_slots > 0 &&
        1.0 - static_cast<double>(u.used_tokens) / u.allocated_slots >= p.on_fragmentation) {
      *reason = "fragmentation";
    }
  }
  return !reason->empty();
}

std::optional<WorkerServer::Exit> WorkerServer::ContinueDrain(Clock::time_point now) {
  KVSERVE_CHECK_THREAD(loop_thread_);
  if (engine_->HasWork() && now >= drain_deadline_) AbortForDrainTimeout();
  if (!engine_->HasWork() && idle_since_ == Clock::time_point()) idle_since_ = now;
  if (engine_->HasWork()) idle_since_ = Clock::time_point();
  // Idle: keep answering "draining" for a short grace period, so that a request already on
  // the wire gets a retryable error instead of vanishing with the process.
  if (grant_pending_ && now >= grant_commit_) grant_pending_ = false;  // committed
  // A held grant is never acted on: it may still be revoked.
  if (grant_pending_ || engine_->HasWork() || now - idle_since_ < std::chrono::milliseconds(200)) {
    return std::nullopt;
  }
  if (recycle_after_drain_ && !stop_after_drain_) metrics_->CountRecycle(drain_reason_);
  state_ = pb::WORKER_STATE_STOPPING;
  UpdateMetrics();
  kv_events_->PublishAllCleared();
  PublishStatus();
  // A SIGTERM during a recycle drain wins: the process is being stopped, not replaced.
  return recycle_after_drain_ && !stop_after_drain_ ? Exit::kRecycle : Exit::kStopped;
}

void WorkerServer::AbortForDrainTimeout() {
  KVSERVE_CHECK_THREAD(loop_thread_);
  for (const std::string& id : engine_->AbortAll()) {
    auto it = routes_.find(id);
    if (it == routes_.end()) continue;
    pb::GenerateResponse r;
    r.set_request_id(id);
    r.set_finish_reason(pb::FINISH_REASON_ABORT);
    r.mutable_error()->set_code(static_cast<int>(absl::StatusCode::kUnavailable));
    r.mutable_error()->set_message(
        absl::StrCat("aborted: the worker's drain timeout passed (", drain_reason_, ")"));
    Respond(it->second, r);
    routes_.erase(it);
    metrics_->CountRequestEnd("abort");
  }
}

}  // namespace kvserve::worker
