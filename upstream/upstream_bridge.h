// An OpenAI-compatible server the router does not run (vLLM, SGLang, another kvserve) made to
// look like a kvserve worker, so that the router's core routes it as any other: admission, the
// cost policy, streams, aborts and deadlines need no second path (docs/INTEROP.md).
//
//   ROUTER --port         GenerateRequest / AbortRequest / Control in, as a worker takes them;
//                         each request becomes POST /v1/completions by token ids, streamed, on
//                         a thread of its own (completion_wire.h); its deltas go back numbered
//   PUB    --events-port  "kv": the upstream's vLLM-format KV events re-hashed with kvserve's
//                         block hash (vllm_event_translator.h), and KvSnapshots on request;
//                         "status": heartbeats made from the upstream's /metrics
//                         (vllm_load.h)
//
// The upstream's event stream is read from its start (a replay from sequence 0) and replayed
// again from where a gap begins, so a bridge started after the engine knows its cache. Until
// the first scrape has told the block size and the model, the heartbeat says STARTING, and so
// again when scrapes fail (the router stops sending it requests) and at once when a request
// cannot reach it (that request is refused as never run, so the router places it elsewhere). A
// new upstream process (its process_start_time_seconds changed, or its event stream started
// again) has its blocks cleared from the router's view.
//
// Threads: Run's caller owns the sockets, the translator and the book of requests; one
// thread per request in flight (HTTP, blocking) and one scraper thread hand their results over
// a locked queue and an eventfd.
#ifndef KVSERVE_UPSTREAM_UPSTREAM_BRIDGE_H_
#define KVSERVE_UPSTREAM_UPSTREAM_BRIDGE_H_

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/net/curve.h"
#include "common/net/http_client.h"
#include "common/net/zmq_framing.h"
#include "kvserve/v1/kvserve.pb.h"
#include "upstream/upstream_metrics.h"
#include "upstream/vllm_event_source.h"
#include "upstream/vllm_event_translator.h"
#include "upstream/vllm_load.h"
#include "zmq.hpp"

namespace kvserve::upstream {

struct UpstreamBridgeOptions {
  std::string name;                // worker_id in heartbeats
  Endpoint api;                    // the upstream's HTTP address
  std::string model;               // empty: the first of its /v1/models
  std::string events_endpoint;     // its vLLM KV-event PUB socket; empty: no cache view
  std::string replay_endpoint;     // its replay ROUTER socket; empty: no replay
  bool events_bind = false;        // bind events_endpoint: the engine connects out to it
  int data_parallel_size = 1;      // its engines: rank r's events at the endpoints' port + r
  std::string topic;               // the events' topic ("": any)
  int block_size = 0;              // 0: from vllm:cache_config_info
  int max_concurrency = 256;       // reported as max_num_seqs: the router queues past it
  std::string host = "127.0.0.1";  // kvserve side
  int port = 0, events_port = 0;   // 0: any
  std::string curve_secret_key;    // CURVE server, as a worker (empty: none)
  std::string curve_allowed_clients_dir;
  absl::Duration heartbeat = absl::Milliseconds(250);
  absl::Duration scrape = absl::Milliseconds(500);
  int http_timeout_ms = 5000;  // a scrape's, and a stream's silence
};

class UpstreamBridge {
 public:
  struct Counters {
    int64_t requests = 0, errors = 0, scrapes_failed = 0, event_batches = 0, gaps = 0, replays = 0,
            undecodable = 0;
  };

  static absl::StatusOr<std::unique_ptr<UpstreamBridge>> Create(UpstreamBridgeOptions options);
  ~UpstreamBridge();
  [[nodiscard]] int port() const { return port_; }
  [[nodiscard]] int events_port() const { return events_port_; }
  // Serves until `*stop`; then cancels what is in flight and joins its threads.
  absl::Status Run(const std::atomic<bool>* stop);
  // /metrics' text and /ready's answer; any thread.
  [[nodiscard]] std::string SerializeMetrics() const { return metrics_.Serialize(); }
  [[nodiscard]] bool ready_now() const { return metrics_.ready->Value() > 0; }

 private:
  struct Call;  // one request in flight (upstream_bridge.cc)
  // What the other threads hand the loop.
  struct Handoff {
    std::string request_id;
    std::vector<kvserve::v1::GenerateResponse> deltas;
    bool done = false;
    std::optional<absl::StatusOr<UpstreamLoad>> scrape;
    std::string model;       // the scraper learned it
    bool unreached = false;  // the call never reached the upstream
  };

  explicit UpstreamBridge(UpstreamBridgeOptions options);
  void Post(Handoff h);
  void TakeHandoffs();
  void HandleMessage(const ReceivedMessage& m);
  void StartCall(const std::string& identity, const kvserve::v1::GenerateRequest& req);
  void Reply(const std::string& identity, const google::protobuf::Message& m);
  void SendDeltas(Call& call, std::vector<kvserve::v1::GenerateResponse>& deltas, bool done);
  void HandleControl(const std::string& identity, const kvserve::v1::Control& c);
  void PublishStatus();
  void PublishSnapshot();
  void OnScrape(const absl::StatusOr<UpstreamLoad>& load);
  void ReadEvents();
  void ApplyVllmBatch(uint64_t seq, std::string_view payload);
  // One KvEventBatch of `events` (none when empty), numbered next.
  void PublishEvents(std::vector<kvserve::v1::KvEvent>& events, int64_t timestamp_ms);
  void AskReplays();  // every engine's stream from its start
  // The upstream is a new process: the router forgets its blocks (AllBlocksCleared) before it
  // is routed to again, and its stream is read from its start.
  void ForgetUpstreamCache(std::string_view why);
  void Scrape(const std::atomic<bool>* stop);
  [[nodiscard]] bool ready() const;

  UpstreamBridgeOptions o_;
  zmq::context_t ctx_;
  std::unique_ptr<ZapAuthenticator> zap_;
  zmq::socket_t router_{ctx_, zmq::socket_type::router};
  zmq::socket_t pub_{ctx_, zmq::socket_type::pub};
  std::vector<std::unique_ptr<VllmEventSource>> sources_;  // one per engine, when given
  int port_ = 0, events_port_ = 0;
  int wake_fd_ = -1;
  uint64_t instance_id_ = 0;

  absl::Mutex mu_;
  std::deque<Handoff> handoffs_ ABSL_GUARDED_BY(mu_);

  // The loop thread's.
  std::map<std::string, std::unique_ptr<Call>> calls_;
  std::optional<UpstreamLoad> load_;
  absl::Time last_scrape_ok_ = absl::InfinitePast();
  std::optional<double> upstream_started_;  // its process_start_time_seconds
  bool restart_in_stream_ = false;          // since the last scrape, its events showed one
  std::string model_;
  int block_size_ = 0;
  bool draining_ = false;
  std::optional<VllmEventTranslator> translator_;
  uint64_t kv_seq_ = 0;                    // our batches published
  VllmEventTranslator::Counters skipped_;  // the translator's counts already in metrics_
  UpstreamMetrics metrics_;
};

}  // namespace kvserve::upstream

#endif  // KVSERVE_UPSTREAM_UPSTREAM_BRIDGE_H_
