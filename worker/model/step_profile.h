// Where an engine step's host time goes, by phase: what `kvserve-bench engine` reports per
// decode step (docs/PERF.md, "The engine's host path"). Off by default: with it on, each step
// reads the steady clock about a dozen times and the thread's CPU clock twice.
//
//   engine->EnableStepProfile(true);
//   ... engine->Step() ...
//   const StepProfile& p = engine->step_profile();
//   double schedule_us = 1e6 * p.seconds[StepPhase::kSchedule] / p.steps;
//
// Plain data, written by the engine thread during Step() and read by it between steps.
#ifndef KVSERVE_WORKER_MODEL_STEP_PROFILE_H_
#define KVSERVE_WORKER_MODEL_STEP_PROFILE_H_

#include <array>
#include <chrono>
#include <cstdint>
#include <string_view>

namespace kvserve::worker {

// The phases of Engine::Step in the order they run. kInputs, kLaunch and kDownload are rank
// 0's model (ForwardTimes); kRunner is the rest of the runner's Execute (block copies, the
// hand-over to the other ranks and the wait for them, the null and sim devices' stand-in).
enum class StepPhase {
  kSchedule,     // Scheduler::Schedule: picks, KV allocation, preemption
  kPlan,         // BuildStepPlan and the masks and layer-stream sends attached to it
  kInputs,       // the batch packed and uploaded (tokens, positions, slots, block tables)
  kLaunch,       // the forward pass and the draw queued on the backend (or a graph replayed)
  kDownload,     // waiting for the drawn tokens and logprobs, and unpacking them
  kRunner,       // the rest of ModelRunner::Execute
  kCacheCommit,  // newly full blocks registered in the prefix cache (KV events fire here)
  kBookkeeping,  // the drawn tokens appended (logprobs, forks for n > 1, block hashes)
  kStopChecks,   // stop ids, EOS, constraints, max_tokens, context length
  kOutputs,      // SequenceOutputs collected, finished requests retired
  kCount,
};

[[nodiscard]] std::string_view StepPhaseName(StepPhase phase);

// Seconds per phase, indexed by StepPhase.
struct PhaseSeconds {
  std::array<double, static_cast<size_t>(StepPhase::kCount)> s{};
  double& operator[](StepPhase p) { return s[static_cast<size_t>(p)]; }
  double operator[](StepPhase p) const { return s[static_cast<size_t>(p)]; }
};

struct StepProfile {
  int64_t steps = 0;        // steps that ran a batch
  PhaseSeconds seconds;     // summed over those steps
  double wall_seconds = 0;  // Step() from entry to return
  double cpu_seconds = 0;   // the engine thread's CPU time in Step() (a GPU's time excluded)
};

// Rank 0's model phases of one step (kInputs, kLaunch, kDownload), when the batch asks.
struct ForwardTimes {
  double inputs = 0, launch = 0, download = 0;
};

// Adds the time since the last lap to a phase: one clock read per phase.
class PhaseClock {
 public:
  using Clock = std::chrono::steady_clock;
  PhaseClock() : last_(Clock::now()) {}
  // The seconds since the last lap (or construction), and a new lap from now.
  double Lap() {
    const Clock::time_point now = Clock::now();
    const double s = std::chrono::duration<double>(now - last_).count();
    last_ = now;
    return s;
  }

 private:
  Clock::time_point last_;
};

// The calling thread's CPU time in seconds.
[[nodiscard]] double ThreadCpuSeconds();

}  // namespace kvserve::worker

#endif  // KVSERVE_WORKER_MODEL_STEP_PROFILE_H_
