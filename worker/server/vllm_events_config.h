// vLLM's --kv-events-config (vllm/config/kv_events.py, KVEventsConfig), as kvserve-worker takes
// it: a JSON object with vLLM's keys and defaults. A key kvserve does not know, or a value of the
// wrong type, is refused by name.
//
//   kvserve-worker ... --kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq",
//       "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558", "topic": "kv"}'
#ifndef KVSERVE_WORKER_SERVER_VLLM_EVENTS_CONFIG_H_
#define KVSERVE_WORKER_SERVER_VLLM_EVENTS_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace kvserve::worker {

struct VllmEventsConfig {
  bool enable_kv_cache_events = false;
  std::string publisher = "null";  // "zmq" publishes; "null" (or events disabled) does not
  // The PUB socket: bound when it has a wildcard host ('*', '::') or is ipc:// or inproc://,
  // else connected (vLLM's rule).
  std::string endpoint = "tcp://*:5557";
  std::optional<std::string> replay_endpoint;  // a ROUTER socket, always bound
  int64_t buffer_steps = 10000;                // batches kept for replay
  int64_t hwm = 100000;                        // the PUB socket's send high-water mark
  int64_t max_queue_size = 100000;             // batches waiting for the publisher thread
  std::string topic;                           // the first frame of every message

  // Whether a publisher runs: enabled and publisher "zmq".
  [[nodiscard]] bool publishes() const { return enable_kv_cache_events && publisher == "zmq"; }
};

// InvalidArgument naming the key for an unknown key, a wrong type, a publisher other than
// "null" and "zmq", an endpoint that is not tcp://, ipc:// or inproc://, or a count below 1.
absl::StatusOr<VllmEventsConfig> ParseVllmEventsConfig(std::string_view json);

}  // namespace kvserve::worker

#endif  // KVSERVE_WORKER_SERVER_VLLM_EVENTS_CONFIG_H_
