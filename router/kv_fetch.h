// Peer prefix fetch (docs/DISAGGREGATION.md): a request placed on worker A whose prompt another
// worker B caches further pulls the extra blocks from B before A runs it, when moving them
// takes less time than prefilling them. The router relays the transfer over its CURVE links:
//   router -> B  KvExportRequest (the prompt, from A's first missing block)
//   B -> router  KvChunk ... (the last marked last)        router -> A  each KvChunk as it came
//   A -> router  KvChunkAck per chunk (cached, or refused with why)
// With a device-to-device link between A and B (router/kv_links.h), the chunks carry only their
// headers and B sends the blocks over the link; a failed attempt closes the link, and the retry
// goes through the relay.
// The request goes to A after the last ack, or once the transfer failed twice (retried once,
// from the first block not yet acked; not retried when a retry cannot help: another prompt or
// format, no room, unsupported), or at once when B went silent; A then prefills what did not
// arrive. Nothing half-written is ever read: A caches a chunk only once checked whole.
//
//   KvFetches fetches(config, &pool, metrics);
//   if (auto plan = PlanFetch(config, fetches.gbps(), views, index, hashes, to)) {
//     fetches.Start(id, request, to, *plan, now);            // the request waits
//   }
//   fetches.Start(id, request, to, plan, now, phase_id);     // or streamed as `phase_id` runs
//   fetches.OnMessage(w, message, now, done);                // KvChunk / KvChunkAck from Poll
//   fetches.Expire(views, now, done);                        // timeouts, silent peers
//   for (const KvFetches::Done& d : done) SendTheRequest(d.request_id);
//
// One thread (the router's core) owns it and the pool it sends on.
#ifndef KVSERVE_ROUTER_KV_FETCH_H_
#define KVSERVE_ROUTER_KV_FETCH_H_

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/kv/block_hash.h"
#include "kvserve/v1/kvserve.pb.h"
#include "router/kv_links.h"
#include "router/routing/fetch_plan.h"
#include "router/worker_pool.h"

namespace kvserve::router {

class RouterMetrics;

class KvFetches {
 public:
  using Clock = std::chrono::steady_clock;

  // A fetch that ended: the request may go to its worker now. `status` is OK when every block
  // planned arrived, else why the rest did not (the request prefills them).
  struct Done {
    std::string request_id;
    uint64_t fetch = 0;    // Start's number, to match the request's current placement
    int first_block = 0;   // the plan's
    int blocks_added = 0;  // blocks the target cached
    absl::Status status;
  };

  // `links` (may be null: none) lends a fetch a device-to-device link when its two workers have
  // an idle one; it outlives this.
  KvFetches(const KvFetchConfig& config, WorkerPool* pool, RouterMetrics* metrics,
            KvLinks* links = nullptr)
      : config_(config), pool_(pool), metrics_(metrics), links_(links) {}

  // Asks the plan's source for the blocks of `request`'s prompt, for worker `to`. Returns the
  // fetch's number (never 0), or 0 when the ask could not be sent (the request goes now).
  // With `stream_request_id` (layer streaming, docs/DISAGGREGATION.md): the source streams the
  // blocks over an idle link as that request, to be sent to it next, prefills them; 0 when no
  // link is idle. Its attempt may last the link's timeout; a retry pulls what the source
  // caches by then, as a fetch does.
  uint64_t Start(const kvserve::v1::GenerateRequest& request, int to, const FetchPlan& plan,
                 Clock::time_point now, const std::string& stream_request_id = "");
  // A worker's KvChunk or KvChunkAck, as Poll gave it. Fetches that ended go to `done`.
  void OnMessage(int w, const ReceivedMessage& m, Clock::time_point now, std::vector<Done>& done);
  // Ends or retries attempts past their timeout, or whose source or target went silent.
  void Expire(absl::Span<const WorkerView> views, Clock::time_point now, std::vector<Done>& done);
  // Forgets fetch `fetch` (its request was aborted, moved or ended); its late chunks are dropped.
  void Cancel(uint64_t fetch);

  // The achieved rate of the transfers so far (a moving average), or initial_gbps.
  [[nodiscard]] double gbps() const { return gbps_; }
  [[nodiscard]] size_t in_flight() const { return fetches_.size(); }

 private:
  struct Fetch {
    std::string request_id;
    kvserve::v1::KvExportRequest ask;  // transfer_id names the current attempt
    int source = -1, target = -1;
    int planned_blocks = 0, first_block = 0;  // the plan's
    int attempt = 1;
    absl::Duration budget;  // one attempt's time
    Clock::time_point first_started, deadline;
    // The current attempt: the block after each chunk relayed to the target, in order, and how
    // many of them the target acknowledged; whether the source sent its last.
    std::vector<int> chunk_ends;
    size_t chunks_acked = 0;
    bool source_done = false;
    int blocks_added = 0, blocks_received = 0;  // over all attempts
    int64_t bytes = 0;
    uint32_t link = 0;      // the current attempt's device-to-device link (0: the relay)
    bool streamed = false;  // the first attempt streamed: its time is not a transfer's
  };

  // Sends fetch `f`'s ask (a new attempt's transfer id); false when it cannot be sent.
  bool Ask(uint64_t id, Fetch& f, Clock::time_point now);
  // The attempt failed with `why`: retried once when that can help and the source is fresh,
  // else the fetch ends.
  void Fail(uint64_t id, const absl::Status& why, bool source_fresh, Clock::time_point now,
            std::vector<Done>& done);
  void Finish(uint64_t id, absl::Status status, Clock::time_point now, std::vector<Done>& done);
  // Gives the attempt's link back: kept when the attempt ended whole (every chunk relayed was
  // acknowledged after the source's last), closed otherwise (the two ends may be out of step).
  void ReleaseLink(Fetch& f, Clock::time_point now);
  // The fetch an attempt's transfer id names (0: none).
  [[nodiscard]] uint64_t Find(const std::string& transfer_id) const;
  void OnChunk(int w, const ReceivedMessage& m, Clock::time_point now, std::vector<Done>& done);
  void OnAck(int w, const kvserve::v1::KvChunkAck& ack, Clock::time_point now,
             std::vector<Done>& done);

  const KvFetchConfig config_;
  WorkerPool* pool_;
  RouterMetrics* metrics_;
  KvLinks* links_;
  absl::flat_hash_map<uint64_t, Fetch> fetches_;
  absl::flat_hash_map<std::string, uint64_t> by_transfer_;  // attempt's transfer id -> fetch
  uint64_t next_id_ = 1;
  double gbps_ = config_.initial_gbps;
};

}  // namespace kvserve::router

#endif  // KVSERVE_ROUTER_KV_FETCH_H_
