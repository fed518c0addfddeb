// Test helpers for the router against a worker that follows a script instead of a model: a
// ScriptedWorker (ready heartbeats, each request answered with the script's messages), a real
// router front before it (HttpFront + RouterCore), and a raw HTTP POST.
#ifndef KVSERVE_TESTS_ROUTER_SCRIPTED_WORKER_H_
#define KVSERVE_TESTS_ROUTER_SCRIPTED_WORKER_H_

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/net/frame_link.h"
#include "frontend/http/http_front.h"
#include "gtest/gtest.h"
#include "kvserve/v1/kvserve.pb.h"
#include "nlohmann/json.hpp"
#include "router/router_core.h"
#include "router/router_metrics.h"
#include "tests/testing/net.h"
#include "zmq.hpp"

namespace kvserve::router {

// The front end the tests put before the core.
using frontend::FrontOptions;
using frontend::HttpFront;

// Heartbeats as a ready worker; answers each request with `reply(request)`'s messages, numbered
// 1, 2, 3, ... unless a message sets its own seq: all at once, or one per `pace` as a model
// would make them (then an AbortRequest stops the answer). Counts the aborts it receives.
// While holding, the last message of each answer is kept back (the request stays in flight)
// until Hold(false).
class ScriptedWorker {
 public:
  using Reply = std::function<std::vector<kvserve::v1::GenerateResponse>(
      const kvserve::v1::GenerateRequest&)>;
  // With `link`, it also serves a framed link (WorkerStatus.link_port, as kvserve-worker
  // --link-port does): requests on it are answered on it.
  explicit ScriptedWorker(Reply reply,
                          std::chrono::microseconds pace = std::chrono::microseconds(0),
                          bool link = false);
  ~ScriptedWorker();
  int port() const { return port_; }
  int events_port() const { return events_port_; }
  int aborts() const { return aborts_.load(); }
  // Requests whose last message is held back now.
  int held() const { return held_count_.load(); }
  void Hold(bool hold) { holding_ = hold; }
  // The --max-num-seqs its heartbeats report (0: none).
  void SetMaxNumSeqs(int n) { max_num_seqs_ = n; }
  // The state its heartbeats report from now on.
  void SetState(kvserve::v1::WorkerState state) { state_ = state; }
  // Stops heartbeating and answering, like a process that hangs.
  void Freeze() { frozen_ = true; }
  // Links accepted so far; closes the one open now (its loop does, soon after).
  int links() const { return links_.load(); }
  void DropLink() { drop_link_ = true; }

 private:
  void Loop();
  // A READY heartbeat, at most every 50 ms.
  void Heartbeat();
  void Answer(const std::string& peer, const kvserve::v1::GenerateRequest& req);
  // Waits up to `timeout` for a message; true if it was an AbortRequest.
  bool ReceiveAbort(std::chrono::microseconds timeout);
  // Sends to a ZeroMQ peer, or to the link (peer kLinkPeer).
  void Send(const std::string& peer, const kvserve::v1::GenerateResponse& r);
  // Accepts a link, reads it (answering its requests), drops it when asked.
  void ServeLink();
  static constexpr const char* kLinkPeer = "link";

  Reply reply_;
  std::chrono::microseconds pace_;
  std::chrono::steady_clock::time_point last_heartbeat_;
  zmq::context_t ctx_;
  zmq::socket_t pub_{ctx_, zmq::socket_type::pub}, router_{ctx_, zmq::socket_type::router};
  int port_ = 0, events_port_ = 0;
  std::atomic<kvserve::v1::WorkerState> state_{kvserve::v1::WORKER_STATE_READY};
  std::atomic<bool> stop_{false}, frozen_{false};
  std::atomic<int> aborts_{0}, held_count_{0}, max_num_seqs_{0};
  std::atomic<bool> holding_{false};
  std::vector<std::pair<std::string, kvserve::v1::GenerateResponse>> held_;  // (peer, message)
  // The framed link: its listener (-1: none) and port, the connection open now.
  int link_listener_ = -1, link_port_ = 0;
  std::unique_ptr<FrameLink> link_;
  std::atomic<int> links_{0};
  std::atomic<bool> drop_link_{false};
  std::thread thread_;
};

// A script's answer: one token (1000), then the end (length, with usage).
std::vector<kvserve::v1::GenerateResponse> OneToken(const kvserve::v1::GenerateRequest& req);

// The front's options in these tests: model "tiny", max_model_len 256.
FrontOptions TinyFront();

// A ScriptedWorker named "scripted" behind a real HttpFront and RouterCore on 127.0.0.1 (any
// free port).
class ScriptedFrontTest : public ::testing::Test {
 protected:
  // With front.api_threads 0 the core runs on the front's I/O thread, as kvserve-router's does.
  void Start(ScriptedWorker::Reply reply, FrontOptions front = TinyFront(),
             std::chrono::microseconds pace = std::chrono::microseconds(0));
  void TearDown() override;

  // Set before Start (its workers and metrics are Start's); worker_link_: the worker serves a
  // framed link.
  RouterOptions router_options_;
  bool worker_link_ = false;
  std::unique_ptr<ScriptedWorker> worker_;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  RouterMetrics metrics_;
  std::unique_ptr<RouterCore> core_;
  std::unique_ptr<HttpFront> front_;
};

// POST `body` to path over a fresh connection, with `headers` ("Name: value\r\n" each); returns
// the whole response as sent (read until the server closes, 30 s at most).
std::string PostRaw(int port, const std::string& path, const nlohmann::json& body,
                    const std::string& headers = "");

// POST `body` to path over a fresh connection; returns {status, parsed body}.
std::pair<int, nlohmann::json> Post(int port, const std::string& path, const nlohmann::json& body,
                                    const std::string& headers = "");

}  // namespace kvserve::router

#endif  // KVSERVE_TESTS_ROUTER_SCRIPTED_WORKER_H_
