// WorkerServer: control actions (drain, undrain, recycle grants and revokes, snapshot requests),
// and the drain they start: no new requests, in-flight ones finished or aborted at the drain
// timeout, a recycle grant held revocable until committed, then the exit.
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
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
  if (drain_->Start(c.reason().empty() ? fallback : c.reason(), recycle, Clock::now())) {
    PublishState();
  }
  return absl::OkStatus();
}

absl::Status WorkerServer::Undrain() {
  KVSERVE_CHECK_THREAD(loop_thread_);
  RETURN_IF_ERROR(drain_->Undrain());
  PublishState();
  return absl::OkStatus();
}

absl::Status WorkerServer::HoldGrant(const pb::Control& c) {
  KVSERVE_CHECK_THREAD(loop_thread_);
  if (c.instance_id() != 0 && c.instance_id() != instance_id_) {
    return absl::FailedPreconditionError("the grant is for an earlier instance of this worker");
  }
  if (drain_->draining()) return absl::OkStatus();  // a second replica's grant for the slot: held
  drain_->HoldGrant(NowMs(), c.coordinator_id(), c.reason().empty() ? "recycle" : c.reason(),
                    Clock::now());
  PublishState();
  return absl::OkStatus();
}

absl::Status WorkerServer::RevokeGrant(const pb::Control& c) {
  KVSERVE_CHECK_THREAD(loop_thread_);
  RETURN_IF_ERROR(drain_->RevokeGrant(c.coordinator_id(), Clock::now()));
  PublishState();
  return absl::OkStatus();
}

absl::Status WorkerServer::DenyRecycle() {
  KVSERVE_CHECK_THREAD(loop_thread_);
  drain_->DenyRecycle();
  return absl::OkStatus();
}

absl::Status WorkerServer::Snapshot() {
  KVSERVE_CHECK_THREAD(loop_thread_);
  kv_events_->PublishSnapshot(*engine_);
  return absl::OkStatus();
}

void WorkerServer::PublishState() {
  KVSERVE_CHECK_THREAD(loop_thread_);
  state_ = drain_->state();
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
  if (engine_->HasWork() && drain_->PastDeadline(now)) AbortForDrainTimeout();
  const std::optional<Exit> exit = drain_->Finished(now, engine_->HasWork());
  if (!exit) return std::nullopt;
  if (*exit == Exit::kRecycle) metrics_->CountRecycle(drain_->reason());
  state_ = pb::WORKER_STATE_STOPPING;
  UpdateMetrics();
  kv_events_->PublishAllCleared();
  PublishStatus();
  return exit;
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
        absl::StrCat("aborted: the worker's drain timeout passed (", drain_->reason(), ")"));
    Respond(it->second, r);
    routes_.erase(it);
    metrics_->CountRequestEnd("abort");
  }
}

}  // namespace kvserve::worker
