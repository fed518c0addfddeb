// The worker's Prometheus metrics: KV block pool (device and host tiers), swap traffic,
// preemptions, prefix cache, evictions, KV-event sequence; request states, latency histograms
// and token counters; lifecycle; and the vLLM names that vLLM's dashboards, the llm-d scheduler
// and production-stack's autoscaling query (vllm:num_requests_running, vllm:kv_cache_usage_perc,
// vllm:time_to_first_token_seconds, vllm:request_success_total, ...), labelled with model_name
// as vLLM labels them. Counters follow the engine's own totals (Update adds the difference since
// the last call), so scrapes agree with EngineStats at quiescent points.
//
//   WorkerMetrics metrics("worker-0", "llama-3-8b", info);
//   metrics.Update(engine.stats(), state, uptime, event_seq);   // engine thread
//   std::string text = metrics.Serialize();                     // HTTP thread
#ifndef KVSERVE_WORKER_SERVER_WORKER_METRICS_H_
#define KVSERVE_WORKER_SERVER_WORKER_METRICS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "worker/engine.h"

namespace kvserve::worker {

struct CacheConfigInfo {
  int block_size = 16;
  std::string cache_dtype;
  int num_gpu_blocks = 0;
  int num_cpu_blocks = 0;
  bool enable_prefix_caching = true;
  int tensor_parallel_size = 1;
};

// One request that ran to its end, as the per-request histograms see it. Times in seconds:
// queue (arrival to first scheduling), prefill (first scheduling to first token), decode (first
// token to last), inference (first scheduling to last token).
struct FinishedRequest {
  double e2e = 0, queue = 0, tpot = 0, prefill = 0, decode = 0, inference = 0;
  int64_t prompt_tokens = 0, generation_tokens = 0, n = 1, max_tokens = 0;
  std::string reason;  // "stop" or "length"
};

class WorkerMetrics {
 public:
  // `vllm_names`: also publish vLLM's metric names (vllm:num_requests_running, ...). They
  // contain ':', which promtool's linter flags (Prometheus reserves colons for recording
  // rules), so a scrape that must lint clean can turn them off.
  WorkerMetrics(const std::string& worker_id, const std::string& model_name,
                const CacheConfigInfo& info, bool vllm_names = true);

  // Engine thread: refresh gauges and counters from the engine's totals.
  void Update(const EngineStats& s, int64_t allocated_slots, int64_t used_tokens, bool draining,
              double uptime_seconds, uint64_t event_seq);
  void ObserveFirstToken(double ttft_s) { Observe(ttft_, ttft_s); }
  void ObserveInterToken(double itl_s) { Observe(itl_, itl_s); }
  // A request that ran to its end: its latencies, sizes, parameters and finish reason.
  void ObserveFinished(const FinishedRequest& r);
  // One engine step's tokens as vLLM counts them: prompt tokens computed plus tokens generated.
  void ObserveStepTokens(int64_t tokens) {
    Observe(iteration_tokens_, static_cast<double>(tokens));
  }
  // A request that ended otherwise ("abort": by its client or a drain timeout).
  void CountRequestEnd(const std::string& reason);
  // The recycle counts of earlier processes of this worker; every reason the worker asks a
  // recycle for starts at 0, so that the series exist before the first recycle.
  void StartRecycleCounts(const std::map<std::string, int64_t>& earlier);
  void CountRecycle(const std::string& reason);
  void CountDropped(const std::string& reason);
  // Totals of ZeroMQ peers the CURVE handler accepted and refused (the series exist only when
  // CURVE is on).
  void UpdateAuthentications(int64_t accepted, int64_t refused);
  // Totals of vLLM-format KV-event batches sent and dropped on a full queue (the series exist
  // only with --kv-events-config).
  void UpdateVllmEvents(int64_t published, int64_t dropped);
  // The reply queue (reply_queue.h): replies waiting for a router that is slow to read, and
  // totals of replies that had to wait and that were dropped (their router gone or stuck).
  void UpdateReplies(size_t waiting, int64_t waited, int64_t dropped);

  // KV transfer (docs/DISAGGREGATION.md): one chunk sent ("out") or cached ("in") in the cache's
  // format: its blocks, wire bytes and the loop time it took; a chunk refused, by reason.
  void ObserveKvChunk(const std::string& direction, const std::string& format, int64_t blocks,
                      int64_t bytes, double seconds);
  void CountKvTransferFailure(const std::string& direction, const std::string& reason,
                              int count = 1);
  // A worker that moves KV: its transfer series at 0 (both directions in `format`, each reason).
  void StartKvTransfer(const std::string& format);

  // Any thread: the text exposition format.
  [[nodiscard]] std::string Serialize() const;

 private:
  using Labels = std::map<std::string, std::string>;
  // A latency histogram under its kvserve name and, with vLLM names on, its vllm: name.
  struct Latency {
    prometheus::Histogram* kvserve = nullptr;
    prometheus::Histogram* vllm = nullptr;
  };
  Latency MakeLatency(const std::string& kvserve_name, const std::string& vllm_name,
                      const std::string& help);
  Latency MakeHistogram(const std::string& kvserve_name, const std::string& vllm_name,
                        const std::string& help,
                        const prometheus::Histogram::BucketBoundaries& buckets);
  static void Observe(const Latency& h, double seconds);
  // Adds n to both finish-reason counters of `reason`.
  void AddRequestEnds(const std::string& reason, double n);
  // Series of the kvserve_ families (labels: worker and `labels`) and of the vllm: ones (worker,
  // model_name and `labels`).
  prometheus::Gauge& G(const std::string& name, const std::string& help, const Labels& labels = {});
  prometheus::Counter& C(const std::string& name, const std::string& help,
                         const Labels& labels = {});
  prometheus::Gauge& VllmG(const std::string& name, const std::string& help);
  prometheus::Counter& VllmC(const std::string& name, const std::string& help,
                             const Labels& labels = {});
  void Add(prometheus::Counter& c, double total);
  void UpdateVllm(const EngineStats& s, double usage);
  // The KV transfer's series (ObserveKvChunk).
  prometheus::Counter& KvCounter(const std::string& name, const std::string& direction,
                                 const std::string& format);
  prometheus::Histogram& KvChunkSeconds(const std::string& direction);

  std::shared_ptr<prometheus::Registry> registry_;
  Labels base_;  // worker
  std::string model_name_;
  std::map<std::string, prometheus::Family<prometheus::Gauge>*> gauges_;
  std::map<std::string, prometheus::Family<prometheus::Counter>*> counters_;
  Latency ttft_, tpot_, itl_, e2e_, queue_;
  Latency prefill_, decode_, inference_, prompt_tokens_, generation_tokens_, params_n_,
      params_max_tokens_, iteration_tokens_;
  prometheus::Family<prometheus::Histogram>* kv_chunk_seconds_ = nullptr;
  int block_size_;
  bool vllm_names_;
  std::map<prometheus::Counter*, double> last_;  // totals already counted
};

}  // namespace kvserve::worker

#endif  // KVSERVE_WORKER_SERVER_WORKER_METRICS_H_
