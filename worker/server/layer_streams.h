// Layer streaming between workers (docs/DISAGGREGATION.md). A prefill worker sends a request's
// prompt blocks over a device-to-device link layer by layer as its steps compute them
// (Engine::StreamPrefill), telling the router each step's blocks before the step (an announcing
// KvChunk) and their fingerprints after it; the decode worker queues the receives on the
// announce and caches the blocks once their bytes arrived and match.
// - As a source: a KvExportRequest with a stream_request_id waits here for its request (a
//   stream ask), whose prefill then streams; an error reply to the request ends its ask with an
//   error chunk.
// - As a target: an announcing chunk queues the receives; a chunk of fingerprints waits here
//   until its bytes arrived, and is then cached and acknowledged (in order on each link).
//
// The worker loop's, which is also the engine's (the engine calls the stream's steps back from
// Step); WorkerServer owns it.
#ifndef KVSERVE_WORKER_SERVER_LAYER_STREAMS_H_
#define KVSERVE_WORKER_SERVER_LAYER_STREAMS_H_

#include <chrono>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kvserve/v1/kvserve.pb.h"
#include "worker/engine.h"
#include "worker/server/kv_link_table.h"
#include "worker/server/reply_queue.h"
#include "worker/server/worker_metrics.h"

namespace kvserve::worker {

class LayerStreams {
 public:
  // All are the server's and outlive this.
  LayerStreams(Engine* engine, KvLinkTable* links, ReplyQueue* replies, WorkerMetrics* metrics)
      : engine_(engine), links_(links), replies_(replies), metrics_(metrics) {}

  // A stream ask from router `identity`: it waits for its request, or starts now when the
  // request runs already (`running`: it streams what its later steps compute).
  void Ask(const std::string& identity, const kvserve::v1::KvExportRequest& req, bool running);
  // Starts the stream ask for `request_id` (just added to the engine), if any.
  void Start(const std::string& request_id);
  // Ends the stream ask for `request_id`, if any, with an error chunk naming `why`.
  void Fail(const std::string& request_id, const absl::Status& why);
  // A target's streamed chunk (link_id set, and an announce or fingerprints).
  void OnChunk(const std::string& identity, const kvserve::v1::KvChunk& c);
  // The streams' sends past the engine's last step, and the receives whose bytes arrived.
  void Poll();
  // Something to poll for: receives to finish, or the engine's sends.
  [[nodiscard]] bool waiting() const;
  // Link `link_id` of `router` closed: its asks go, unanswered.
  void ForgetLink(const std::string& router, uint32_t link_id);

 private:
  using Clock = std::chrono::steady_clock;
  struct StreamAsk {
    std::string identity;
    kvserve::v1::KvExportRequest req;
  };
  struct Finish {
    std::string identity;
    kvserve::v1::KvChunk chunk;
    Clock::time_point since;
  };

  // Sends the error chunk, marked last, of the stream `req` asked for.
  void SendError(const std::string& identity, const kvserve::v1::KvExportRequest& req,
                 uint32_t index, const absl::Status& why);

  Engine* const engine_;
  KvLinkTable* const links_;
  ReplyQueue* const replies_;
  WorkerMetrics* const metrics_;
  std::vector<StreamAsk> asks_;
  std::deque<Finish> finishes_;
};

}  // namespace kvserve::worker

#endif  // KVSERVE_WORKER_SERVER_LAYER_STREAMS_H_
