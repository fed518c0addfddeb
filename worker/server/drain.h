// A worker's drain and recycle states, as a state machine with no sockets or engine: whether it
// accepts requests, why it stopped accepting, when in-flight requests are cut off, the recycle
// grant it holds (revocable until committed) and whether it has asked for one. WorkerServer acts
// on what it says: refuses requests, aborts at the deadline, publishes state() and exits.
//
//   admin DRAIN ─────────────► draining (never exits on its own; UNDRAIN undoes it)
//   RECYCLE / granted recycle ► draining, recycling: exits kRecycle once idle
//   SIGTERM ─────────────────► draining, stopping: exits kStopped once idle (wins over recycle)
//   RECYCLE_GRANT ───────────► a recycling drain whose grant is held `grant_hold`: never exits
//                              while held; RECYCLE_REVOKE in the hold undoes it
//
// Not thread-safe: WorkerServer owns its Drain on the loop thread, as it does its other parts.
//
//   if (drain.Start("admin", /*recycle=*/false, now)) publish(drain.state());
//   if (drain.ends() && has_work && drain.PastDeadline(now)) AbortAll();
//   if (std::optional<Drain::Exit> exit = drain.Finished(now, has_work)) return *exit;
#ifndef KVSERVE_WORKER_SERVER_DRAIN_H_
#define KVSERVE_WORKER_SERVER_DRAIN_H_

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "kvserve/v1/kvserve.pb.h"

namespace kvserve::worker {

class Drain {
 public:
  using Clock = std::chrono::steady_clock;
  enum class Exit { kStopped, kRecycle };
  // A recycle grant in its hold: WorkerStatus.recycle_grant_ms and recycle_granted_by.
  struct HeldGrant {
    int64_t granted_ms = 0;  // wall clock, milliseconds since the epoch
    std::string by;          // the router replica that granted it
  };

  // `timeout`: how long in-flight requests may run once a drain begins; `grant_hold`: how long a
  // recycle grant stays revocable; `idle_grace`: how long an idle drain keeps answering
  // "draining" before it exits, so that a request already on the wire gets a retryable error.
  Drain(Clock::duration timeout, Clock::duration grant_hold,
        Clock::duration idle_grace = std::chrono::milliseconds(200))
      : timeout_(timeout), grant_hold_(grant_hold), idle_grace_(idle_grace) {}

  [[nodiscard]] bool draining() const { return draining_; }
  // Why the drain began ("admin", "requests", "sigterm", ...); the last one's once it ended.
  [[nodiscard]] const std::string& reason() const { return reason_; }
  // READY, DRAINING, or RECYCLING (a recycle not overruled by SIGTERM).
  [[nodiscard]] kvserve::v1::WorkerState state() const;
  // True when the drain ends the process (a recycle or SIGTERM), not an admin drain.
  [[nodiscard]] bool ends() const { return draining_ && (recycle_ || stop_); }

  // Begins a drain (or marks one under way as ending in a recycle). True when state() changed.
  bool Start(const std::string& reason, bool recycle, Clock::time_point now);
  // SIGTERM: the drain, begun now or under way, ends in a stop. True when state() changed.
  bool Stop(Clock::time_point now);
  // Control UNDRAIN: refused once the drain ends in a recycle or a stop.
  absl::Status Undrain();
  // Control RECYCLE_GRANT: a recycling drain, held `grant_hold` before it commits. A grant while
  // draining is taken as held already (a second replica's grant for the same slot).
  void HoldGrant(int64_t granted_ms, const std::string& by, const std::string& reason,
                 Clock::time_point now);
  // Control RECYCLE_REVOKE from replica `by`: undoes a grant in its hold (a SIGTERM meanwhile
  // keeps the drain).
  absl::Status RevokeGrant(const std::string& by, Clock::time_point now);
  // The grant in its hold at `now`, if any.
  [[nodiscard]] std::optional<HeldGrant> held(Clock::time_point now) const;

  // Asks for a recycle slot: true the first time since the last deny or revoke (to log it).
  bool AskRecycle();
  // Control RECYCLE_DENY: ask again later.
  void DenyRecycle() { recycle_asked_ = false; }

  // Whether in-flight requests have run past the drain timeout.
  [[nodiscard]] bool PastDeadline(Clock::time_point now) const {
    return draining_ && now >= deadline_;
  }
  // An ending drain's exit, once it has been idle `idle_grace` with no grant in its hold.
  std::optional<Exit> Finished(Clock::time_point now, bool has_work);

 private:
  Clock::duration timeout_, grant_hold_, idle_grace_;
  bool draining_ = false;
  bool recycle_ = false;  // ends in a recycle (unless stop_)
  bool stop_ = false;     // SIGTERM came: ends in a stop
  bool recycle_asked_ = false;
  std::string reason_;
  Clock::time_point deadline_;
  std::optional<Clock::time_point> idle_since_;
  // The grant in its hold: revocable until commit_.
  std::optional<HeldGrant> grant_;
  Clock::time_point commit_;
};

}  // namespace kvserve::worker

#endif  // KVSERVE_WORKER_SERVER_DRAIN_H_
