#include "tools/route_sim/goodput.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace kvserve::route_sim {

absl::StatusOr<Goodput> FindGoodput(const std::vector<trace::TraceRequest>& trace,
                                    const SimOptions& options, const Slo& slo,
                                    const GoodputSearch& search) {
  if (!(search.min_speedup > 0) || !(search.max_speedup > search.min_speedup)) {
    return absl::InvalidArgumentError(
        absl::StrCat("goodput search bounds must be 0 < min < max (got ", search.min_speedup,
                     " and ", search.max_speedup, ")"));
  }
  if (search.steps < 1) return absl::InvalidArgumentError("goodput search steps must be >= 1");
  const std::vector<trace::TraceRequest> window =
      trace::Window(trace, options.window_start_ms, options.window_end_ms);
  int64_t first = 0, last = 0;
  if (!window.empty()) {
    const auto [lo, hi] = std::minmax_element(
        window.begin(), window.end(),
        [](const auto& a, const auto& b) { return a.timestamp_ms < b.timestamp_ms; });
    first = lo->timestamp_ms, last = hi->timestamp_ms;
  }
  if (last <= first) {
    return absl::InvalidArgumentError(
        "the replayed window needs requests at two different times to have a rate");
  }
  const double span_s = static_cast<double>(last - first) / 1000.0;
  Goodput g;
  auto attempt = [&](double speedup) -> absl::StatusOr<bool> {
    SimOptions o = options;
    o.speedup = speedup;
    ASSIGN_OR_RETURN(SimReport r, Simulate(trace, o));
    const bool met = r.json["errors"].get<int64_t>() == 0 &&
                     r.json["p99_ttft_ms"].get<double>() <= slo.ttft_p99_ms &&
                     r.json["p99_tpot_ms"].get<double>() <= slo.tpot_p99_ms;
    const double rate = static_cast<double>(window.size()) / (span_s / speedup);
    g.tries.push_back(
        {.speedup = speedup, .requests_per_second = rate, .met = met, .report = r.json});
    if (met && speedup > g.speedup) g.speedup = speedup, g.requests_per_second = rate;
    return met;
  };
  double lo = search.min_speedup, hi = search.max_speedup;
  ASSIGN_OR_RETURN(const bool slow_met, attempt(lo));
  if (!slow_met) return g;
  ASSIGN_OR_RETURN(const bool fast_met, attempt(hi));
  if (fast_met) return g;
  for (int i = 0; i < search.steps; ++i) {
    const double mid = std::sqrt(lo * hi);
    ASSIGN_OR_RETURN(const bool met, attempt(mid));
    (met ? lo : hi) = mid;
  }
  return g;
}

}  // namespace kvserve::route_sim
