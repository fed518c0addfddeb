// The engine's layer streaming (docs/DISAGGREGATION.md). A prefill engine sends each layer's KV
// of the prompt blocks a step completes as soon as the step has queued that layer's writes,
// over one device link per rank, so the transfer overlaps the later layers' compute; a decode
// engine receives them into fresh blocks and caches them once whole and checked (through the
// PrefixTransfer part). The worker's side, which carries the announces and fingerprints
// between workers, is worker/server/layer_streams.h.
//
// A part of the Engine, which owns it and calls it on the engine thread (no step in flight but
// the one PlanSends and FinishSends frame); the sends are queued by the rank threads
// (ForwardBatch::after_kv_write). It owns the streams, the receives and the step's send
// errors; the runner, the KV cache manager, the transfer part and the requests are the engine's.
#ifndef KVSERVE_WORKER_LAYER_STREAMER_H_
#define KVSERVE_WORKER_LAYER_STREAMER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/peer_link.h"
#include "worker/kv_cache/kv_cache_manager.h"
#include "worker/model_runner.h"
#include "worker/prefix_transfer.h"
#include "worker/request/request.h"
#include "worker/step_plan.h"

namespace kvserve::worker {

// One of a stream's steps, as its sender's on_step hears it (Engine::StreamPrefill).
struct StreamStep {
  int first_block = 0;
  int num_blocks = 0;
  std::vector<uint64_t> fingerprints;  // one per rank once the step ran; empty before
  bool last = false;
};

class LayerStreamer {
 public:
  // The request running here under an id, or null.
  using FindRequest = std::function<const Request*(const std::string& request_id)>;
  // A request's prefill being streamed.
  struct OutStream {
    std::string request_id;
    std::vector<kernels::PeerLink*> links;  // one per rank
    std::function<void(const StreamStep&)> on_step;
    int next_block = 0;     // the first prompt block not sent yet
    bool ended = false;     // `last` was said: only its held blocks remain
    std::vector<int> held;  // blocks whose sends may be in flight
  };
  // One step's sends of a stream's blocks (PlanSends' for FinishSends).
  struct Send {
    OutStream* stream;
    int first_block;
    std::vector<int> blocks;
  };

  // `runner`, `kv` and `transfer` are the engine's and outlive this.
  LayerStreamer(ModelRunner* runner, KvCacheManager* kv, PrefixTransfer* transfer, int block_size,
                FindRequest find_request)
      : runner_(runner),
        kv_(kv),
        transfer_(transfer),
        block_size_(block_size),
        find_request_(std::move(find_request)) {}

  // Engine::StreamPrefill, PollLayerStreams, StartStreamedReceive, FinishStreamedReceive and
  // DropLinkStreams (worker/engine.h says what each does).
  absl::Status StartStream(const std::string& request_id, int first_block, PeerLinks links,
                           std::function<void(const StreamStep&)> on_step);
  absl::StatusOr<bool> Poll();
  absl::Status StartReceive(PeerLinks links, absl::Span<const int32_t> prompt,
                            const std::string& cache_salt, int first_block, int num_blocks);
  absl::StatusOr<std::optional<int>> FinishReceive(PeerLinks links,
                                                   absl::Span<const uint64_t> fingerprints);
  void DropLink(const kernels::PeerLink* link0);

  // A step's part: the sends of its streamed blocks, announced (on_step) and queued layer by
  // layer through the batch's after_kv_write; after the step, held and fingerprinted.
  std::vector<Send> PlanSends(StepPlan& plan);
  void FinishSends(std::vector<Send>& sends);

  [[nodiscard]] bool has_streams() const { return !streams_.empty(); }
  [[nodiscard]] bool has_receives() const { return !receives_.empty(); }

 private:
  // Blocks being received, in the order the sender sends them.
  struct Receive {
    kernels::PeerLink* link0;  // names the links
    std::vector<int32_t> prompt;
    std::string cache_salt;
    int first_block = 0;
    std::vector<int> targets;
  };

  // Each rank's fingerprint of `blocks` (layer by layer, as LayerRanges gives them).
  std::vector<uint64_t> Fingerprints(absl::Span<const int> blocks);
  // Checks a receive whose bytes arrived against the sender's fingerprints, and caches it;
  // the blocks added.
  absl::StatusOr<int> CacheReceived(const Receive& r, absl::Span<const uint64_t> fingerprints);

  ModelRunner* const runner_;
  KvCacheManager* const kv_;
  PrefixTransfer* const transfer_;
  const int block_size_;
  const FindRequest find_request_;
  std::vector<std::unique_ptr<OutStream>> streams_;
  std::deque<Receive> receives_;
  // The step's sends' failures, one slot per rank (written by that rank's thread in the step).
  std::shared_ptr<std::vector<absl::Status>> send_errors_;
};

}  // namespace kvserve::worker

#endif  // KVSERVE_WORKER_LAYER_STREAMER_H_
