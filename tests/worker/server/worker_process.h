// Test helpers for kvserve-worker as a real process: start it on free ports, a DEALER client,
// a SUB subscriber, and HTTP GET against its metrics port.
#ifndef KVSERVE_TESTS_WORKER_SERVER_WORKER_PROCESS_H_
#define KVSERVE_TESTS_WORKER_SERVER_WORKER_PROCESS_H_

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/net/curve.h"
#include "common/net/zmq_framing.h"
#include "kvserve/v1/kvserve.pb.h"
#include "zmq.hpp"

namespace kvserve::testing {

int FreePort();

class WorkerProcess {
 public:
  // Starts kvserve-worker with `args` plus fixed free ports; waits until it is ready.
  static absl::StatusOr<std::unique_ptr<WorkerProcess>> Start(const std::vector<std::string>& args);
  ~WorkerProcess();

  int port() const { return port_; }
  int events_port() const { return events_port_; }
  int metrics_port() const { return metrics_port_; }
  // Its framed link's port, from the ports file (0: none).
  int link_port() const { return link_port_; }
  pid_t pid() const { return pid_; }
  // Sends SIGTERM and waits; returns the exit code (or -signal), -1000 on timeout.
  int Terminate(int timeout_s = 30);
  bool Alive();
  // Reads the ports file again (after a recycle), returns the new instance id.
  absl::StatusOr<uint64_t> WaitForNewInstance(uint64_t old_instance, int timeout_s);
  uint64_t instance_id() const { return instance_id_; }

 private:
  pid_t pid_ = -1;
  int port_ = 0, events_port_ = 0, metrics_port_ = 0, link_port_ = 0;
  uint64_t instance_id_ = 0;
  std::string ports_file_;
};

// Runs kvserve-worker with exactly `args` to its exit (one that refuses to start); returns
// {exit status, what it printed on stdout and stderr}.
std::pair<int, std::string> RunWorkerToExit(const std::vector<std::string>& args);

// GET http://127.0.0.1:port/path; returns {status, body}.
absl::StatusOr<std::pair<int, std::string>> HttpGet(int port, const std::string& path);

// A DEALER client that sends generate requests and collects responses.
class Client {
 public:
  // With `curve`, a CURVE client with those keys (common/net/curve.h). A `small_buffers` client
  // holds one message and a few kB in its queues, so that a worker's replies back up fast
  // while it does not read.
  Client(zmq::context_t& ctx, int port, const CurveClientKeys* curve = nullptr,
         bool small_buffers = false);
  absl::Status Send(const google::protobuf::Message& m);
  // Next message (type, payload) within timeout_ms, nullopt on timeout.
  std::optional<ReceivedMessage> Receive(int timeout_ms);
  zmq::socket_t& socket() { return socket_; }

 private:
  zmq::socket_t socket_;
};

kvserve::v1::GenerateRequest MakeRequest(const std::string& id, const std::vector<int32_t>& prompt,
                                         int max_tokens, bool stream = true);

}  // namespace kvserve::testing

#endif  // KVSERVE_TESTS_WORKER_SERVER_WORKER_PROCESS_H_
