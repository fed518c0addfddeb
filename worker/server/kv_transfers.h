// The KV transfer's messages at a worker (docs/DISAGGREGATION.md). As a source, a
// KvExportRequest is answered with KvChunks of the prompt's device-cached blocks (over a link:
// each chunk's bytes start over the link, then its header goes through the router, and the loop
// goes on until the send ends; a stream ask goes to the layer streams); as a target, each
// KvChunk the router relays is checked whole, cached, and acknowledged with a KvChunkAck. Any
// failure on a link drops it at this end.
//
// The worker loop's, between engine steps; WorkerServer owns it.
//
//   transfers.OnMessage(m, draining, running);  // KvExportRequest / KvChunk
//   transfers.AdvanceLinkExports();             // each turn
#ifndef KVSERVE_WORKER_SERVER_KV_TRANSFERS_H_
#define KVSERVE_WORKER_SERVER_KV_TRANSFERS_H_

#include <chrono>
#include <deque>
#include <optional>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "common/net/zmq_framing.h"
#include "kvserve/v1/kvserve.pb.h"
#include "worker/engine.h"
#include "worker/server/kv_link_table.h"
#include "worker/server/layer_streams.h"
#include "worker/server/reply_queue.h"
#include "worker/server/worker_metrics.h"

namespace kvserve::worker {

class KvTransfers {
 public:
  // All are the server's and outlive this.
  KvTransfers(Engine* engine, KvLinkTable* links, LayerStreams* streams, ReplyQueue* replies,
              WorkerMetrics* metrics)
      : engine_(engine), links_(links), streams_(streams), replies_(replies), metrics_(metrics) {}

  // A KvExportRequest or KvChunk from router `m.prefix`. `draining`: why this worker drains
  // (null: it does not), when it caches no peer's blocks but those already on a link.
  // `running(id)`: whether request `id` runs here (a stream ask's).
  void OnMessage(const ReceivedMessage& m, const std::string* draining,
                 absl::FunctionRef<bool(const std::string&)> running);
  // Exports over links, one at a time (the engine's outgoing staging pool holds one chunk):
  // advances the one in flight as its chunk's send ends, then the next.
  void AdvanceLinkExports();
  // A chunk's send over a link is in flight.
  [[nodiscard]] bool exporting() const { return link_export_.has_value(); }

 private:
  using Clock = std::chrono::steady_clock;
  struct LinkExport {
    std::string identity;
    kvserve::v1::KvExportRequest req;
    uint32_t index = 0;
    int at = 0;        // the next chunk's first block
    bool more = true;  // a chunk follows the one in flight
    int blocks = 0;    // the chunk in flight's
    Clock::time_point start;
  };

  void Export(const std::string& identity, const kvserve::v1::KvExportRequest& req);
  void Import(const std::string& identity, const kvserve::v1::KvChunk& c,
              const std::string* draining);
  // Stages the next chunk of `e`, sends its header and starts its bytes; false when the source
  // caches no block there (the header, marked last, ended the export).
  absl::StatusOr<bool> SendNextLinkChunk(LinkExport& e, KvLink& link);
  // Ends `e` with an error chunk naming `s`, and drops its link.
  void FailLinkExport(const LinkExport& e, const absl::Status& s);

  Engine* const engine_;
  KvLinkTable* const links_;
  LayerStreams* const streams_;
  ReplyQueue* const replies_;
  WorkerMetrics* const metrics_;
  std::optional<LinkExport> link_export_;  // its chunk in flight
  std::deque<LinkExport> link_exports_waiting_;
};

}  // namespace kvserve::worker

#endif  // KVSERVE_WORKER_SERVER_KV_TRANSFERS_H_
