// kvserve-worker's serving loop: the engine plus its ZeroMQ endpoints and HTTP probes.
//
//   ROUTER --port         GenerateRequest / AbortRequest / Control in; GenerateResponse deltas
//                         (numbered per request: seq 1, 2, ...) and ControlReply out, to the
//                         sender's routing id; a reply to a slow reader waits, never vanishes
//                         (reply_queue.h)
//                         KvExportRequest in, KvChunk out (this worker a transfer's source);
//                         KvChunk in, KvChunkAck out (its target; docs/DISAGGREGATION.md)
//   PUB    --events-port  topic "kv": KvEventBatch (every change to the cached-block set, per
//                         medium, seq +1 per batch) and KvSnapshot (on request); topic "status":
//                         WorkerStatus heartbeats; topic "control": RECYCLE_REQUEST
//   TCP    --link-port    (off unless given) the ROUTER port's messages over a framed TCP link,
//                         for routers with --worker-link=tcp (link_server.h); its replies go
//                         back on the connection the request came on
//   HTTP   --metrics-port /metrics (Prometheus), /health (200 while the loop runs), /ready
//                         (200 only when READY)
//   PUB / ROUTER, --kv-events-config: the same KV changes as vLLM publishes them
//                         (vllm_event_publisher.h), for consumers written for vLLM
//
// One thread (the caller of Run) owns the engine and both sockets: it polls the ROUTER,
// steps the engine, sends outputs and publishes events and heartbeats. Messages from the
// network are untrusted: malformed frames, unknown types, bad payloads, duplicate request ids
// and aborts of unknown ids are answered with an error or dropped and counted, never a crash.
//
// Drain (Control DRAIN, SIGTERM or a granted recycle): accept nothing new, finish in-flight
// requests (aborted with a reason after --drain-timeout), publish all-cleared, return.
//
// The methods live by job: worker_server.cc (construction, the loop), worker_dispatch.cc
// (requests in, replies out), worker_liveness.cc (heartbeats, metrics), worker_drain.cc
// (control, drain, recycle: the states are drain.h's). Parts of their own, with their own state:
// the KV events (kv_event_feed.h), the device-to-device links (kv_link_table.h), the layer streams
// over them (layer_streams.h) and the transfers' messages (kv_transfers.h). wire.h converts the
// messages.
#ifndef KVSERVE_WORKER_SERVER_WORKER_SERVER_H_
#define KVSERVE_WORKER_SERVER_WORKER_SERVER_H_

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/kv/vllm_kv_events.h"
#include "common/net/curve.h"
#include "common/net/http_server.h"
#include "common/net/zmq_framing.h"
#include "common/thread_checker.h"
#include "kvserve/v1/kvserve.pb.h"
#include "worker/engine.h"
#include "worker/kv_link_maker.h"
#include "worker/server/drain.h"
#include "worker/server/kv_event_feed.h"
#include "worker/server/kv_link_table.h"
#include "worker/server/kv_transfers.h"
#include "worker/server/layer_streams.h"
#include "worker/server/link_server.h"
#include "worker/server/load_reports.h"
#include "worker/server/publisher.h"
#include "worker/server/reply_queue.h"
#include "worker/server/vllm_event_publisher.h"
#include "worker/server/worker_metrics.h"
#include "zmq.hpp"

namespace kvserve::worker {

struct RecyclePolicy {
  int64_t after_requests = 0;   // 0: off
  double after_seconds = 0;     // 0: off
  double on_rss_growth_mb = 0;  // 0: off
  double on_fragmentation = 0;  // fraction of allocated slots unused; 0: off
};

struct WorkerServerOptions {
  std::string worker_id;
  std::string host = "127.0.0.1";          // the ZeroMQ sockets
  std::string metrics_host = "127.0.0.1";  // /metrics, /health, /ready
  int port = 0;                            // 0: any free port
  int link_port = -1;                      // -1: no framed link; 0: any free port
  int events_port = 0;
  int metrics_port = 0;
  absl::Duration heartbeat = absl::Milliseconds(250);
  // While its load changes, the worker publishes a status with its load report this often,
  // besides the heartbeats (load_reports.h).
  absl::Duration load_report_interval = absl::Milliseconds(50);
  absl::Duration drain_timeout = absl::Seconds(30);
  // A recycle grant is held this long (revocable, no new requests) before the worker commits to
  // it: long enough for every router replica to see it in a heartbeat and revoke a conflict.
  absl::Duration recycle_grant_hold = absl::Seconds(1);
  RecyclePolicy recycle;
  // Planned recycles of the processes this one replaced (re-exec), by reason: the worker's
  // kvserve_recycles_total continues from them instead of restarting at 0.
  std::map<std::string, int64_t> earlier_recycles;
  bool vllm_metric_names = true;
  // CURVE (common/net/curve.h): the worker's secret key and the directory of the router keys it
  // accepts. Empty: the sockets are unauthenticated.
  std::string curve_secret_key;
  std::string curve_allowed_clients_dir;
  // Keys allowed besides the directory's: the one --openai-port's front made for itself.
  std::vector<AllowedClient> curve_also_allowed;
  // WorkerStatus.http_endpoint (set_http_endpoint): empty when it serves no OpenAI API.
  std::string http_endpoint;
  // WorkerStatus.role: "prefill", "decode" or "both" (--role; docs/DISAGGREGATION.md).
  std::string role = "both";
  // A router peer that has not taken a waiting reply for this long is given up: its replies
  // are dropped and its requests aborted (reply_queue.h).
  absl::Duration reply_give_up = absl::Seconds(30);
  // vLLM's KV events beside kvserve's (vllm_event_publisher.h); unset: none.
  std::optional<VllmEventsConfig> vllm_events;
  vllm_events::Encoding vllm_events_encoding = vllm_events::Encoding::kMap;
  // Device-to-device KV links (KvLinkOpen; WorkerStatus.kv_link): how this worker makes them.
  KvLinkMaker kv_links;
};

// Whether the options' framed link can be served: not beside CURVE keys (it has no
// authentication yet). Create checks it; a caller checks it before loading weights.
absl::Status CheckLinkOptions(const WorkerServerOptions& options);

class WorkerServer {
 public:
  using Exit = Drain::Exit;

  static absl::StatusOr<std::unique_ptr<WorkerServer>> Create(const WorkerServerOptions& options,
                                                              std::unique_ptr<Engine> engine);
  ~WorkerServer();

  // Serves until drained after SIGTERM (`*stop` true) or a granted recycle.
  absl::StatusOr<Exit> Run(const std::atomic<bool>* stop);

  // One message from the ROUTER socket, as Run's loop hands it on (public for the fuzzer).
  void HandleMessage(const ReceivedMessage& m);

  [[nodiscard]] int port() const { return port_; }
  [[nodiscard]] int events_port() const { return events_port_; }
  // The framed link's port (0: none).
  [[nodiscard]] int link_port() const { return link_port_; }
  [[nodiscard]] int metrics_port() const { return http_->port(); }
  [[nodiscard]] uint64_t instance_id() const { return instance_id_; }
  // Where this worker serves the OpenAI API (WorkerStatus.http_endpoint: "host:port" or ":port"),
  // for endpoint pickers. Before Run only: the heartbeats read it on the loop thread.
  void set_http_endpoint(std::string endpoint) { options_.http_endpoint = std::move(endpoint); }
  // The metrics port's answer: /metrics, /health (200 while the loop runs), /ready (200 only
  // when READY). Any thread (the HTTP server's).
  [[nodiscard]] HttpResponse Probe(const std::string& method, const std::string& target) const;
  // /metrics' text (Prometheus exposition); any thread.
  [[nodiscard]] std::string SerializeMetrics() const { return metrics_->Serialize(); }
  // Why the last drain began ("requests", "uptime", "sigterm", ...; empty if none did).
  [[nodiscard]] const std::string& drain_reason() const {
    KVSERVE_CHECK_THREAD(loop_thread_);
    return drain_->reason();
  }

 private:
  struct Route {
    std::string identity;
    bool stream = true;
    std::chrono::steady_clock::time_point arrival, scheduled, first_token, last_token;
    int completion_tokens = 0;
    int n = 1, max_tokens = 0;  // the request's, for the per-request histograms
    std::vector<kvserve::v1::GenerateResponse> pending;  // per sample, non-streaming
    int predicted_cached = -1;
    uint32_t seq = 0;  // replies sent so far (GenerateResponse.seq)
  };

  using Clock = std::chrono::steady_clock;

  WorkerServer() = default;
  // Parts of one turn of Run: the messages that arrived, an engine step and its outputs, the
  // heartbeat (metrics, status, recycle ask), and a drain's progress (its exit once done).
  absl::Status ReceiveMessages() ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_thread_);
  // Makes the KV side's parts (Create, once the engine, metrics and reply queue exist).
  void MakeKvParts() ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_thread_);
  absl::Status StepEngine() ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_thread_);
  // Folds a step that ran `prompt_tokens` through the model in `seconds` into the prefill rate.
  void MeasurePrefill(int64_t prompt_tokens, double seconds)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_thread_);
  void Heartbeat(Clock::time_point now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_thread_);
  std::optional<Exit> ContinueDrain(Clock::time_point now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_thread_);
  void AbortForDrainTimeout() ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_thread_);
  void HandleGenerate(const std::string& identity, const kvserve::v1::GenerateRequest& req)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_thread_);
  void HandleControl(const std::string& identity, const kvserve::v1::Control& c)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_thread_);
  // The control actions HandleControl serves (worker_drain.cc, through AnswerControl,
  // proto/worker_control.h): OK, or why the action is refused. The loop thread, which each
  // checks (they are called back from AnswerControl).
  absl::Status ControlDrain(const kvserve::v1::Control& c, bool recycle);
  absl::Status Undrain();
  absl::Status HoldGrant(const kvserve::v1::Control& c);
  absl::Status RevokeGrant(const kvserve::v1::Control& c);
  absl::Status DenyRecycle();
  absl::Status Snapshot();
  // An error reply; `seq` is its place among the request's replies (1 when it is the only one).
  void SendError(const std::string& identity, const std::string& request_id, const absl::Status& s,
                 uint32_t seq = 1) ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_thread_);
  void SendOutputs(std::vector<SequenceOutput>& outs) ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_thread_);
  // What the metrics' per-request histograms take of a request ending with `o` at `now`.
  static FinishedRequest Finished(const Route& route, const SequenceOutput& o,
                                  Clock::time_point now);
  void Reply(const std::string& identity, const google::protobuf::Message& m)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_thread_);
  // Numbers `r` as the route's next reply and sends it.
  void Respond(Route& route, kvserve::v1::GenerateResponse& r)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_thread_);
  // Sends waiting replies; aborts the requests of router peers given up on.
  void FlushReplies() ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_thread_);
  // Stops the requests of a router peer that is gone (nobody will read their answers).
  void AbortRequestsOf(const std::string& peer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_thread_);
  void Publish(const std::string& topic, const google::protobuf::Message& m)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_thread_);
  void PublishStatus() ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_thread_);
  // state_ as the drain says, published.
  void PublishState() ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_thread_);
  bool RecycleDue(std::string* reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_thread_);
  // Refreshes the Prometheus metrics from the engine. The token-granularity KV usage walks every
  // running block table, so only heartbeats refresh it (`refresh_kv_usage`).
  void UpdateMetrics(bool refresh_kv_usage = true) ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_thread_);

  // Constant after Create.
  WorkerServerOptions options_;
  int port_ = 0, events_port_ = 0, link_port_ = 0;
  uint64_t instance_id_ = 0;
  std::unique_ptr<HttpServer> http_;        // its own thread; reads metrics_ and state_
  std::unique_ptr<WorkerMetrics> metrics_;  // Prometheus families: thread-safe
  std::atomic<int> state_{kvserve::v1::WORKER_STATE_STARTING};  // read by the HTTP thread

  // Owned by the loop thread (the caller of Run; Create hands everything over to it), checked
  // by every method that touches it (common/thread_checker.h).
  ThreadChecker loop_thread_{"worker loop"};
  // The KV events the engine's cache changes make, kvserve's and vLLM's (kv_event_feed.h):
  // the engine's listener, so declared before it (it outlives the engine).
  std::unique_ptr<KvEventFeed> kv_events_ ABSL_GUARDED_BY(loop_thread_);
  std::unique_ptr<Engine> engine_ ABSL_GUARDED_BY(loop_thread_);
  zmq::context_t ctx_;                     // thread-safe (ZeroMQ)
  std::unique_ptr<ZapAuthenticator> zap_;  // CURVE on: checks every connection's key (own thread)
  std::unique_ptr<zmq::socket_t> router_ ABSL_GUARDED_BY(loop_thread_);
  std::unique_ptr<zmq::socket_t> pub_ ABSL_GUARDED_BY(loop_thread_);
  // The framed link's connections (--link-port; null without it).
  std::unique_ptr<LinkServer> links_ ABSL_GUARDED_BY(loop_thread_);
  // What pub_ publishes, to the links that subscribed too.
  std::unique_ptr<Publisher> publisher_ ABSL_GUARDED_BY(loop_thread_);
  // Every reply, on router_ or on a link's connection.
  std::unique_ptr<ReplyQueue> replies_ ABSL_GUARDED_BY(loop_thread_);
  absl::flat_hash_map<std::string, Route> routes_ ABSL_GUARDED_BY(loop_thread_);
  // Each step's outputs, one vector kept across steps (Engine::StepInto reuses its memory).
  std::vector<SequenceOutput> step_outputs_ ABSL_GUARDED_BY(loop_thread_);
  Clock::time_point started_ ABSL_GUARDED_BY(loop_thread_);
  Clock::time_point next_heartbeat_ ABSL_GUARDED_BY(loop_thread_);
  Clock::time_point next_load_report_ ABSL_GUARDED_BY(loop_thread_);
  // Every status's load report, and the router replicas' placements it has seen.
  LoadReports load_reports_ ABSL_GUARDED_BY(loop_thread_);
  // Whether it accepts requests, and the drain or recycle it is in (drain.h); the loop publishes
  // its state() in state_.
  std::unique_ptr<Drain> drain_ ABSL_GUARDED_BY(loop_thread_);
  int64_t served_requests_ ABSL_GUARDED_BY(loop_thread_) = 0;
  // Prompt tokens per second of steps that ran two blocks of prompt or more (a moving average;
  // 0: none yet): WorkerStatus.prefill_tokens_per_second.
  double prefill_tokens_per_second_ ABSL_GUARDED_BY(loop_thread_) = 0;
  double start_rss_mb_ ABSL_GUARDED_BY(loop_thread_) = 0;
  Engine::KvUsage kv_usage_ ABSL_GUARDED_BY(loop_thread_);  // as the last heartbeat found it

  // The KV side's parts (their own state, the loop thread's): the device-to-device links, the
  // layer streams over them, and the transfers' messages. Made in Create, after replies_.
  std::unique_ptr<KvLinkTable> kv_links_ ABSL_GUARDED_BY(loop_thread_);
  std::unique_ptr<LayerStreams> layer_streams_ ABSL_GUARDED_BY(loop_thread_);
  std::unique_ptr<KvTransfers> kv_transfers_ ABSL_GUARDED_BY(loop_thread_);
};

}  // namespace kvserve::worker

#endif  // KVSERVE_WORKER_SERVER_WORKER_SERVER_H_
