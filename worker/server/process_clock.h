// The clocks and process figures the worker server states in its messages and metrics: wall
// time in Unix milliseconds (timestamps on the wire), steady-clock durations in seconds, and
// the process's resident memory (the RSS-growth recycle rule).
//
//   st.set_timestamp_ms(NowMs());
//   metrics.ObserveFirstToken(Seconds(now - arrival));
//
// Any thread.
#ifndef KVSERVE_WORKER_SERVER_PROCESS_CLOCK_H_
#define KVSERVE_WORKER_SERVER_PROCESS_CLOCK_H_

#include <chrono>
#include <cstdint>

namespace kvserve::worker {

inline double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

inline int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Resident memory in MiB (/proc/self/statm; 0 where it cannot be read).
double RssMb();

}  // namespace kvserve::worker

#endif  // KVSERVE_WORKER_SERVER_PROCESS_CLOCK_H_
