#include "worker/model/step_profile.h"

#include <ctime>

namespace kvserve::worker {

std::string_view StepPhaseName(StepPhase phase) {
  switch (phase) {
    case StepPhase::kSchedule:
      return "schedule";
    case StepPhase::kPlan:
      return "plan";
    case StepPhase::kInputs:
      return "inputs";
    case StepPhase::kLaunch:
      return "launch";
    case StepPhase::kDownload:
      return "download";
    case StepPhase::kRunner:
      return "runner";
    case StepPhase::kCacheCommit:
      return "cache_commit";
    case StepPhase::kBookkeeping:
      return "bookkeeping";
    case StepPhase::kStopChecks:
      return "stop_checks";
    case StepPhase::kOutputs:
      return "outputs";
    case StepPhase::kCount:
      break;
  }
  return "?";
}

double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

}  // namespace kvserve::worker
