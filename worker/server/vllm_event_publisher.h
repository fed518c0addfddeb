// vLLM's ZeroMQ KV-event publisher protocol (vllm/distributed/kv_events.py, ZmqEventPublisher),
// for consumers written for vLLM:
//   PUB    `endpoint`          [topic, seq (8 bytes, big-endian, from 0), payload] per batch
//   ROUTER `replay_endpoint`   in: [start seq (8 bytes, big-endian)] from a REQ socket (or a
//                              DEALER sending an empty delimiter first); out: [seq, payload] for
//                              every kept batch from `start` on, then [-1 (8 bytes), ""]
// The payload is a vllm_events::Encode batch; `buffer_steps` batches are kept for replay.
//
// Threads: Publish belongs to one thread (the worker loop), which hands each payload over an
// inproc pipe; the publisher's own thread numbers, sends and keeps them and answers replays, so
// a slow subscriber or a replay never stalls the engine. A payload that finds the pipe full
// (`max_queue_size`) is dropped and counted, never waited for.
#ifndef KVSERVE_WORKER_SERVER_VLLM_EVENT_PUBLISHER_H_
#define KVSERVE_WORKER_SERVER_VLLM_EVENT_PUBLISHER_H_

#include <atomic>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "absl/status/statusor.h"
#include "worker/server/vllm_events_config.h"
#include "zmq.hpp"

namespace kvserve::worker {

class VllmEventPublisher {
 public:
  // Binds (or connects) the sockets as `config` says; config.publishes() must hold.
  static absl::StatusOr<std::unique_ptr<VllmEventPublisher>> Start(zmq::context_t& ctx,
                                                                   const VllmEventsConfig& config);
  // Sends every batch queued before, then stops the thread.
  ~VllmEventPublisher();

  // Queues one encoded batch. Call from one thread only.
  void Publish(std::string payload);

  // The PUB and replay sockets' resolved addresses (a port 0 or '*' made concrete).
  [[nodiscard]] const std::string& endpoint() const { return endpoint_; }
  [[nodiscard]] const std::string& replay_endpoint() const { return replay_endpoint_; }
  // Batches sent on the PUB socket, and dropped because the queue to the publisher thread was
  // full. Any thread.
  [[nodiscard]] int64_t published() const { return published_.load(); }
  [[nodiscard]] int64_t dropped() const { return dropped_.load(); }

 private:
  explicit VllmEventPublisher(zmq::context_t& ctx) : ctx_(ctx) {}
  // The publisher thread: waits on the pipe and the replay socket until the stop message.
  void Loop();
  // Numbers, sends and keeps the next queued batch; false at the stop message.
  bool SendNext();
  // Answers one replay request (a malformed one is logged and ignored).
  void ServeReplay();

  zmq::context_t& ctx_;
  VllmEventsConfig config_;
  std::string endpoint_, replay_endpoint_;
  std::string pipe_address_;
  std::unique_ptr<zmq::socket_t> in_;  // PUSH: the Publish caller's
  // The publisher thread's: the pipe's PULL end, PUB and ROUTER (made on the caller's thread in
  // Start, before the thread exists, then used by it alone).
  std::unique_ptr<zmq::socket_t> out_, pub_, replay_;
  // The publisher thread's: the next sequence number and the last buffer_steps batches.
  int64_t next_seq_ = 0;
  std::deque<std::pair<int64_t, std::string>> kept_;
  std::atomic<int64_t> published_{0}, dropped_{0};
  std::thread thread_;
};

}  // namespace kvserve::worker

#endif  // KVSERVE_WORKER_SERVER_VLLM_EVENT_PUBLISHER_H_
