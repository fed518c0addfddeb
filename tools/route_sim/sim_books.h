// The simulator's router books (simulator.h): a request in flight as a replica's books hold it,
// and what one replica's books hold of one worker, as router/books.h keeps them for
// kvserve-router.
//
//   books[l.worker].Count(l, 1);   // placed
//   books[l.worker].Count(l, -1);  // ended (or counted again once started)
//
// Plain data; the simulator's one thread.
#ifndef KVSERVE_TOOLS_ROUTE_SIM_SIM_BOOKS_H_
#define KVSERVE_TOOLS_ROUTE_SIM_SIM_BOOKS_H_

#include <cstdint>

namespace kvserve::route_sim {

// A request in flight, as the router's books hold it.
struct Live {
  int worker = 0;
  int replica = 0;
  uint64_t seq = 0;  // its replica's placement number once it reached its worker (0: not yet)
  double arrival = 0;
  int64_t prompt_tokens = 0, predicted_cached = 0, blocks = 0;
  bool started = false;
  double first_token_at = 0;
  int64_t output_tokens = 0;
  // A disaggregated request's prefill phase on a prefill worker (its hit rate counts there);
  // and the request itself on its decode worker (its prompt counts at the phase).
  bool prefill_phase = false, disaggregated = false;
};

// What one router replica's books hold of one worker: its own placements only.
struct Books {
  int64_t active_blocks = 0, queued_prefill = 0, decode_seqs = 0, requests = 0;
  // Counts (sign 1) or uncounts (-1) request `l` as it stands: a decode row once started, its
  // uncached prompt before.
  void Count(const Live& l, int sign) {
    active_blocks += sign * l.blocks;
    requests += sign;
    if (l.started) {
      decode_seqs += sign;
    } else {
      queued_prefill += sign * (l.prompt_tokens - l.predicted_cached);
    }
  }
};

}  // namespace kvserve::route_sim

#endif  // KVSERVE_TOOLS_ROUTE_SIM_SIM_BOOKS_H_
