// One vLLM engine's KV-event stream as kvserve-upstream reads it (a data-parallel pod has one
// per rank): its PUB socket, connected (or bound, for an engine configured to connect out), its
// replay socket, and where its sequence stands. Batches come out in order: at start and after a
// gap the missing ones are asked of the replay socket (live batches that come meanwhile are
// held, and follow the replay's); a replay that does not end within 5 s is given up and the
// live stream taken from there; a live sequence that starts again at 0 is the engine
// restarting.
//
//   VllmEventSource src(ctx, {.events = "tcp://pod:5557", .replay = "tcp://pod:5558"}, "", 0);
//   src.Read({.batch = [&](uint64_t seq, std::string_view payload) { ... },
//             .restart = [&] { ... }}, metrics);
//
// Not thread-safe: the bridge's loop thread owns it.
#ifndef KVSERVE_UPSTREAM_VLLM_EVENT_SOURCE_H_
#define KVSERVE_UPSTREAM_VLLM_EVENT_SOURCE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "upstream/upstream_metrics.h"
#include "zmq.hpp"

namespace kvserve::upstream {

struct VllmEventEndpoints {
  std::string events;  // its PUB socket; empty: none
  std::string replay;  // its replay ROUTER socket; empty: no replay
  bool bind = false;   // bind `events` (the engine connects out) rather than connect
};

class VllmEventSource {
 public:
  struct Callbacks {
    std::function<void(uint64_t seq, std::string_view payload)> batch;  // in order
    std::function<void()> restart;  // the live sequence started again at 0
  };

  // InvalidArgument naming the endpoint that cannot be connected or bound.
  static absl::StatusOr<std::unique_ptr<VllmEventSource>> Open(zmq::context_t& ctx,
                                                               const VllmEventEndpoints& e,
                                                               const std::string& topic, int rank);

  // Its sockets, for the loop's poll.
  void AddPollItems(std::vector<zmq::pollitem_t>& items);
  // Reads what arrived on both sockets.
  void Read(const Callbacks& cb, UpstreamMetrics& metrics);
  // Asks the replay socket for the batches from `from` on (none: takes the stream from there).
  void AskReplay(uint64_t from, UpstreamMetrics& metrics);
  [[nodiscard]] int rank() const { return rank_; }

  static constexpr absl::Duration kReplayGiveUp = absl::Seconds(5);

 private:
  VllmEventSource(zmq::context_t& ctx, int rank);
  void ReadLive(const Callbacks& cb, UpstreamMetrics& metrics);
  void ReadReplay(const Callbacks& cb, UpstreamMetrics& metrics);
  // The live batches held while a replay ran, in order, from next_seq_ on.
  void TakeHeld(const Callbacks& cb, UpstreamMetrics& metrics);

  static constexpr size_t kMaxHeld = 10000;

  int rank_;
  zmq::socket_t sub_, replay_;
  bool has_replay_ = false;
  uint64_t next_seq_ = 0;  // the engine's next expected batch
  bool replaying_ = false;
  absl::Time replay_asked_;               // a replay not ended within kReplayGiveUp is given up
  bool take_next_live_ = false;           // after giving up: the next live batch starts the stream
  std::map<uint64_t, std::string> held_;  // live batches that came during a replay
};

// The endpoints of a data-parallel pod's `ranks` engines: vLLM publishes rank r's events (and
// answers its replays) on the given ports + r. InvalidArgument for an endpoint without a port
// when ranks > 1.
absl::StatusOr<std::vector<VllmEventEndpoints>> RankEndpoints(const VllmEventEndpoints& first,
                                                              int ranks);

}  // namespace kvserve::upstream

#endif  // KVSERVE_UPSTREAM_VLLM_EVENT_SOURCE_H_
