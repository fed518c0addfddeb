// Picks the worker for a request. One policy per file under router/policies/, behind
// RoutingPolicy, made by name (MakeRoutingPolicy, router/policies/factory.h):
//   cost        (default) the least estimated time to first token: the prompt tokens a worker
//               must still prefill (those it does not cache; host-tier ones at their onboarding
//               cost) plus the prefill queued ahead of it, slowed by its decode load, plus KV
//               pressure; a prompt no worker caches beyond new_fraction of it spreads by load
//               (router/policies/cost_policy.cc; docs/ROUTING.md);
//   prefix      the rules before the cost model, kept for comparison: block costs with a
//               least-loaded fallback past absolute and relative load thresholds;
//   round_robin, least_load, and session (rendezvous hashing of a session key).
// Draining, recycling, starting and unhealthy workers are never picked; equal choices rotate.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<RoutingPolicy> policy, MakeRoutingPolicy(config));
//   ASSIGN_OR_RETURN(Decision d, Route(*policy, workers, index, request));
//
// A policy keeps its rotation; one thread uses it (the router's core thread, or a simulator's).
#ifndef KVSERVE_ROUTER_ROUTING_ROUTING_POLICY_H_
#define KVSERVE_ROUTER_ROUTING_ROUTING_POLICY_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "router/routing/prefix_index.h"

namespace kvserve::router {

struct WorkerView {
  int id = 0;
  std::string name;
  bool eligible = true;       // healthy and READY (not draining, recycling or starting)
  bool fresh = true;          // its last heartbeat is within the timeout, whatever its state
  int64_t active_blocks = 0;  // blocks its requests in flight will hold (the router's books)
  int64_t waiting = 0;        // queued requests (its heartbeat)
  // The router's books: prompt tokens its placed requests have yet to prefill (those not
  // started, less what was predicted cached), and sequences past their first token.
  int64_t queued_prefill_tokens = 0;
  int64_t decode_seqs = 0;
  // Its heartbeat: the device pool in blocks (0: not known) and the block size in tokens.
  int64_t capacity_blocks = 0;
  int block_size = 16;
  // Where it serves the OpenAI API over HTTP ("host:port"; empty: nowhere), from its heartbeat.
  std::string http_endpoint;
  // Where it serves /metrics with vLLM's names ("host:port"; empty: nowhere), from its heartbeat.
  std::string metrics_endpoint;
  // Its heartbeat: a block's bytes on the KV transfer's wire (0: it moves no KV), and its
  // measured prefill rate in prompt tokens per second (0: not measured yet). router/kv_fetch.h.
  int64_t kv_wire_block_bytes = 0;
  double prefill_tokens_per_second = 0;
  // Its heartbeat's role: true for a prefill-only worker (docs/DISAGGREGATION.md).
  bool prefill_only = false;
  // Its heartbeat: the device-to-device KV links it joins ("nccl"; empty: none), and its
  // process's instance id (a restart drops its links). router/kv_links.h.
  std::string kv_link;
  uint64_t instance_id = 0;
  // Its heartbeat's tensor-parallel size: a link joins rank r to the peer's rank r.
  int tensor_parallel_size = 1;
};

struct RoutingConfig {
  std::string policy = "cost";
  // cost: a host-tier token costs this fraction of prefilling it (the copy over PCIe against
  // the forward pass; docs/ROUTING.md derives 0.1 for an 8B model on one H100-class GPU).
  double host_cost = 0.1;
  // cost: a prompt whose best cached prefix is under this fraction of it is a new conversation
  // and goes by load alone.
  double new_fraction = 0.1;
  // cost: each decode sequence in a step slows prefill as this many prompt tokens of a chunk
  // of chunk_tokens do.
  double decode_weight = 1.0;
  int64_t chunk_tokens = 2048;
  // cost: each token past the worker's free device pool (what its requests in flight will hold
  // plus this one's uncached blocks) costs this many prompt tokens (it waits or preempts).
  double pressure_weight = 1.0;
  // cost: the uncached tokens count this many times: once for this request's wait, and once for
  // each request that will queue behind the prefill a miss adds (about two at 70% load).
  double miss_weight = 3.0;
  // cost: a peer fetch's transfer time (RouteRequest::fetch_offers) counts this many times,
  // as a miss does: the sweep on the Mooncake traces in docs/DISAGGREGATION.md.
  double fetch_weight = 3.0;
  // cost, while other router replicas place on the same workers (RouteRequest::other_replicas):
  // a new conversation goes to the better of this many workers drawn at random, not the best of
  // all. Replicas that see the same load pick the same best worker for requests they get at the
  // same instant, and none sees the others' (docs/ROUTING.md, "Multi-replica routers"); a few
  // random choices keep them apart. 0: always the best of all.
  int spread_choices = 2;
  // The draws' seed (0: a random one per policy; the simulator sets one per replica).
  uint64_t seed = 0;

  // prefix (the old rules): cost = w_prefill · blocks to prefill + w_load · load blocks, with
  // host blocks saving host_weight of a device block; least-loaded past both thresholds; a
  // prompt cached under spread_below of its blocks goes to the worker caching least.
  double w_prefill = 1.0;
  double w_load = 0.25;
  double host_weight = 0.5;
  int64_t balance_abs_threshold = 512;
  double balance_rel_threshold = 1.5;
  int64_t waiting_blocks = 16;  // load blocks a queued request counts for
  double spread_below = 0.5;
};

// A peer fetch (router/routing/fetch_plan.h) that a worker would make if picked: `blocks` past its
// own cached prefix arrive from a peer in the time it prefills `cost_tokens` prompt tokens.
struct FetchOffer {
  int blocks = 0;
  double cost_tokens = 0;
};

// What a policy knows of the request.
struct RouteRequest {
  absl::Span<const BlockHash> hashes;  // its prompt's full blocks, with the workers' cache key
  int64_t prompt_tokens = 0;
  int64_t max_tokens = 0;
  std::string_view session_key;
  // By worker id (FetchOffers); empty when the router fetches no prefix, or the policy is not
  // to weigh fetches. Only cost weighs them.
  absl::Span<const FetchOffer> fetch_offers;
  // Other router replicas place on these workers too (the workers' load reports say so: Books::
  // OthersPlacing): cost spreads new conversations over RoutingConfig::spread_choices draws.
  bool other_replicas = false;
};

// Why a worker was picked (the metric label): "prefix" (it holds the best cached prefix),
// "spread" (a new conversation, placed by load), "balance" (load outweighed a better cache
// elsewhere), or the plain policies' "round_robin", "least_load", "session".
enum class RouteReason { kPrefix, kSpread, kBalance, kRoundRobin, kLeastLoad, kSession };
std::string_view RouteReasonName(RouteReason reason);

struct Decision {
  int worker = -1;
  RouteReason reason = RouteReason::kPrefix;
  int predicted_cached_blocks = 0;
};

class RoutingPolicy {
 public:
  virtual ~RoutingPolicy() = default;
  // `eligible` is never empty. Returns the picked worker's id and why.
  virtual Decision Pick(const std::vector<const WorkerView*>& eligible, const PrefixIndex& index,
                        const RouteRequest& request) = 0;
};

// Unavailable when no worker is eligible; fills predicted_cached_blocks.
absl::StatusOr<Decision> Route(RoutingPolicy& policy, absl::Span<const WorkerView> workers,
                               const PrefixIndex& index, const RouteRequest& request);

}  // namespace kvserve::router

#endif  // KVSERVE_ROUTER_ROUTING_ROUTING_POLICY_H_
