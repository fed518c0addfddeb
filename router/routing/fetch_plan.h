// Peer prefix fetch's plan (router/kv_fetch.h runs it): whether a worker picked for a request
// should pull the prompt's prefix from a peer, and from which. A pure function of the workers'
// views and the prefix index, so that the router and the offline simulator
// (tools/route_sim/) decide alike.
#ifndef KVSERVE_ROUTER_ROUTING_FETCH_PLAN_H_
#define KVSERVE_ROUTER_ROUTING_FETCH_PLAN_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/kv/block_hash.h"
#include "router/routing/prefix_index.h"
#include "router/routing/routing_policy.h"

namespace kvserve::router {

struct KvFetchConfig {
  bool enabled = false;
  // A fetch moves at least this many blocks (fewer are not worth a round trip).
  int min_blocks = 4;
  // One attempt, from the ask to the last ack.
  absl::Duration timeout = absl::Seconds(2);
  // The link's rate before a transfer has measured it, in GB/s.
  double initial_gbps = 1.0;
  // The most bytes of blocks in one chunk.
  uint32_t max_chunk_bytes = 4u << 20;
  // Device-to-device links between the workers that join them (router/kv_links.h): a fetch
  // whose two workers have an idle one sends its blocks over it; the relay otherwise.
  bool links = false;
  absl::Duration link_timeout = absl::Seconds(30);  // a join, and each transfer's wait
  // With links: a disaggregated request's prefill phase streams its blocks over an idle link
  // layer by layer as it computes them (KvExportRequest.stream_request_id), rather than the
  // decode worker pulling them once the phase ended.
  bool stream_layers = true;
  // The cost policy weighs the fetch each worker would make when it picks one (FetchOffers);
  // otherwise a fetch is planned only for the worker it picked.
  bool in_policy = true;
};

// Pull blocks [first_block, first_block + blocks) of the prompt from `source`.
struct FetchPlan {
  int source = -1;
  int first_block = 0;
  int blocks = 0;
  double transfer_s = 0, prefill_s = 0;  // the estimates that chose it
};

// The plan for target `to`, if any: among fresh workers other than `to` (any state: a draining
// worker still serves its cache) that move KV in `to`'s wire size, the one whose device-cached
// prefix of `hashes` reaches furthest past `to`'s cached one, when at least min_blocks more and
// when bytes / gbps takes less time than prefilling those tokens at `to`'s measured rate (the
// fastest measured rate of a worker of its wire size when `to` has none yet; no plan when none
// has measured).
std::optional<FetchPlan> PlanFetch(const KvFetchConfig& config, double gbps,
                                   absl::Span<const WorkerView> views, const PrefixIndex& index,
                                   absl::Span<const BlockHash> hashes, int to);

// PlanFetch's plan for every eligible worker as a RouteRequest::fetch_offers entry (indexed by
// worker id; an empty offer where there is no plan), the index read once per worker. Empty
// when fetching is off or not in_policy.
std::vector<FetchOffer> FetchOffers(const KvFetchConfig& config, double gbps,
                                    absl::Span<const WorkerView> views, const PrefixIndex& index,
                                    absl::Span<const BlockHash> hashes);

}  // namespace kvserve::router

#endif  // KVSERVE_ROUTER_ROUTING_FETCH_PLAN_H_
