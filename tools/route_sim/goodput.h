// Goodput at a latency target (`kvserve-route-sim --goodput`): the highest rate at which a
// policy serves a trace within the SLO, found by replaying the trace faster or slower
// (SimOptions::speedup) and bisecting on the speed-up, geometrically. What a platform team buys
// is requests per second within its latency target on a fixed fleet, not hit rate.
//
//   ASSIGN_OR_RETURN(Goodput g, FindGoodput(trace, options, {.ttft_p99_ms = 2000}, {}));
//
// Each try is a whole simulation (seconds to a minute). The search assumes that a slower replay
// meets the SLO whenever a faster one does; every try is reported, so a violation shows.
#ifndef KVSERVE_TOOLS_ROUTE_SIM_GOODPUT_H_
#define KVSERVE_TOOLS_ROUTE_SIM_GOODPUT_H_

#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "tools/route_sim/simulator.h"
#include "tools/trace/trace.h"

namespace kvserve::route_sim {

// Met when every request completed and both p99s are within their bounds.
struct Slo {
  double ttft_p99_ms = 2000;
  double tpot_p99_ms = 100;
};

struct GoodputSearch {
  double min_speedup = 0.05;
  double max_speedup = 20;
  int steps = 10;  // bisections between the bounds: the answer within (max/min)^(1/2^steps)
};

struct GoodputTry {
  double speedup = 0;
  double requests_per_second = 0;  // the replayed window's requests over its span / speedup
  bool met = false;
  nlohmann::json report;  // Simulate's
};

struct Goodput {
  // The fastest try that met the SLO (0 and none when even min_speedup did not).
  double speedup = 0;
  double requests_per_second = 0;
  std::vector<GoodputTry> tries;  // in the order made
};

// InvalidArgument for bounds that are not 0 < min < max, fewer than 1 step, or a window with
// fewer than two distinct arrival times; Simulate's errors otherwise.
absl::StatusOr<Goodput> FindGoodput(const std::vector<trace::TraceRequest>& trace,
                                    const SimOptions& options, const Slo& slo,
                                    const GoodputSearch& search);

}  // namespace kvserve::route_sim

#endif  // KVSERVE_TOOLS_ROUTE_SIM_GOODPUT_H_
