#include "worker/server/worker_metrics.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/kv/kv_transfer.h"
#include "prometheus/text_serializer.h"

namespace kvserve::worker {
namespace {

const prometheus::Histogram::BucketBoundaries& LatencyBuckets() {
  static const prometheus::Histogram::BucketBoundaries b = {
      0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};
  return b;
}

// 1, 2, 5, 10, 20, 50, ... up to a million (vLLM's 1-2-5 buckets for token counts).
const prometheus::Histogram::BucketBoundaries& TokenBuckets() {
  static const prometheus::Histogram::BucketBoundaries b = [] {
    prometheus::Histogram::BucketBoundaries out;
    for (double scale = 1; scale <= 1e6; scale *= 10) {
      for (double m : {1, 2, 5}) out.push_back(m * scale);
    }
    return out;
  }();
  return b;
}

}  // namespace

WorkerMetrics::WorkerMetrics(const std::string& worker_id, const std::string& model_name,
                             const CacheConfigInfo& info, bool vllm_names)
    : registry_(std::make_shared<prometheus::Registry>()),
      base_{{"worker", worker_id}},
      model_name_(model_name),
      block_size_(info.block_size),
      vllm_names_(vllm_names) {
  // The standard process metric (vLLM's Python client exports it): a new value is a new process,
  // which is how kvserve-upstream tells an upstream restarted.
  G("process_start_time_seconds", "Start time of the process since the Unix epoch, in seconds")
      .Set(absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()));
  ttft_ = MakeLatency("kvserve_time_to_first_token_seconds", "vllm:time_to_first_token_seconds",
                      "Time from arrival to the first generated token");
  tpot_ = MakeLatency("kvserve_time_per_output_token_seconds", "vllm:time_per_output_token_seconds",
                      "Mean time per output token after the first, per request");
  itl_ = MakeLatency("kvserve_inter_token_latency_seconds", "vllm:inter_token_latency_seconds",
                     "Time between consecutive output deltas of a request");
  e2e_ = MakeLatency("kvserve_e2e_request_latency_seconds", "vllm:e2e_request_latency_seconds",
                     "Time from arrival to the last token");
  queue_ = MakeLatency("kvserve_request_queue_time_seconds", "vllm:request_queue_time_seconds",
                       "Time from arrival to the first scheduling");
  prefill_ =
      MakeLatency("kvserve_request_prefill_time_seconds", "vllm:request_prefill_time_seconds",
                  "Time from the first scheduling to the first token");
  decode_ = MakeLatency("kvserve_request_decode_time_seconds", "vllm:request_decode_time_seconds",
                        "Time from the first token to the last");
  inference_ =
      MakeLatency("kvserve_request_inference_time_seconds", "vllm:request_inference_time_seconds",
                  "Time from the first scheduling to the last token");
  prompt_tokens_ = MakeHistogram("kvserve_request_prompt_tokens", "vllm:request_prompt_tokens",
                                 "Prompt tokens of a finished request", TokenBuckets());
  generation_tokens_ =
      MakeHistogram("kvserve_request_generation_tokens", "vllm:request_generation_tokens",
                    "Generated tokens of a finished request (all its samples)", TokenBuckets());
  params_n_ = MakeHistogram("kvserve_request_params_n", "vllm:request_params_n",
                            "The n of a finished request", {1, 2, 5, 10, 20});
  params_max_tokens_ =
      MakeHistogram("kvserve_request_params_max_tokens", "vllm:request_params_max_tokens",
                    "The max_tokens of a finished request", TokenBuckets());
  iteration_tokens_ =
      MakeHistogram("kvserve_iteration_tokens", "vllm:iteration_tokens_total",
                    "Tokens one engine step ran through the model",
                    {1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384});
  Labels labels = base_;
  labels.insert({{"block_size", std::to_string(info.block_size)},
                 {"cache_dtype", info.cache_dtype},
                 {"num_gpu_blocks", std::to_string(info.num_gpu_blocks)},
                 {"num_cpu_blocks", std::to_string(info.num_cpu_blocks)},
                 {"enable_prefix_caching", info.enable_prefix_caching ? "True" : "False"},
                 {"tensor_parallel_size", std::to_string(info.tensor_parallel_size)}});
  for (const char* name : {"kvserve_cache_config_info", "vllm:cache_config_info"}) {
    if (name[0] == 'v' && !vllm_names_) continue;
    prometheus::BuildGauge()
        .Name(name)
        .Help("Information of the KV cache config")
        .Register(*registry_)
        .Add(labels)
        .Set(1);
  }
  // Every finish reason from the start, at 0, so that rates over them are 0 rather than absent.
  for (const char* reason : {"stop", "length", "abort"}) AddRequestEnds(reason, 0);
}

WorkerMetrics::Latency WorkerMetrics::MakeLatency(const std::string& kvserve_name,
                                                  const std::string& vllm_name,
                                                  const std::string& help) {
  return MakeHistogram(kvserve_name, vllm_name, help, LatencyBuckets());
}

WorkerMetrics::Latency WorkerMetrics::MakeHistogram(
    const std::string& kvserve_name, const std::string& vllm_name, const std::string& help,
    const prometheus::Histogram::BucketBoundaries& buckets) {
  auto hist = [&](const std::string& name, const Labels& labels) {
    return &prometheus::BuildHistogram()
                .Name(name)
                .Help(help)
                .Register(*registry_)
                .Add(labels, buckets);
  };
  Latency h;
  h.kvserve = hist(kvserve_name, base_);
  if (vllm_names_) {
    Labels labels = base_;
    labels["model_name"] = model_name_;
    h.vllm = hist(vllm_name, labels);
  }
  return h;
}

void WorkerMetrics::Observe(const Latency& h, double seconds) {
  h.kvserve->Observe(seconds);
  if (h.vllm != nullptr) h.vllm->Observe(seconds);
}

prometheus::Gauge& WorkerMetrics::G(const std::string& name, const std::string& help,
                                    const Labels& labels) {
  auto& fam = gauges_[name];
  if (fam == nullptr) fam = &prometheus::BuildGauge().Name(name).Help(help).Register(*registry_);
  Labels all = base_;
  all.insert(labels.begin(), labels.end());
  return fam->Add(all);
}

prometheus::Counter& WorkerMetrics::C(const std::string& name, const std::string& help,
                                      const Labels& labels) {
  auto& fam = counters_[name];
  if (fam == nullptr) fam = &prometheus::BuildCounter().Name(name).Help(help).Register(*registry_);
  Labels all = base_;
  all.insert(labels.begin(), labels.end());
  return fam->Add(all);
}

prometheus::Gauge& WorkerMetrics::VllmG(const std::string& name, const std::string& help) {
  return G(name, help, {{"model_name", model_name_}});
}

prometheus::Counter& WorkerMetrics::VllmC(const std::string& name, const std::string& help,
                                          const Labels& labels) {
  Labels all = labels;
  all.insert({"model_name", model_name_});
  return C(name, help, all);
}

void WorkerMetrics::Add(prometheus::Counter& c, double total) {
  double& last = last_[&c];
  if (total > last) c.Increment(total - last);
  last = std::max(last, total);
}

void WorkerMetrics::Update(const EngineStats& s, int64_t allocated_slots, int64_t used_tokens,
                           bool draining, double uptime_seconds, uint64_t event_seq) {
  const char* kBlocks = "kvserve_kv_blocks";
  const char* kBlocksHelp = "KV blocks by tier and state";
  const int device_active = s.blocks_total - s.blocks_free;
  const int host_active = s.host_blocks_total - s.host_blocks_free;
  G(kBlocks, kBlocksHelp, {{"tier", "device"}, {"state", "total"}}).Set(s.blocks_total);
  G(kBlocks, kBlocksHelp, {{"tier", "device"}, {"state", "free"}})
      .Set(s.blocks_free - s.blocks_cached_evictable);
  G(kBlocks, kBlocksHelp, {{"tier", "device"}, {"state", "active"}}).Set(device_active);
  G(kBlocks, kBlocksHelp, {{"tier", "device"}, {"state", "cached_evictable"}})
      .Set(s.blocks_cached_evictable);
  G(kBlocks, kBlocksHelp, {{"tier", "host"}, {"state", "total"}}).Set(s.host_blocks_total);
  G(kBlocks, kBlocksHelp, {{"tier", "host"}, {"state", "free"}})
      .Set(s.host_blocks_free - s.host_blocks_cached_evictable);
  G(kBlocks, kBlocksHelp, {{"tier", "host"}, {"state", "active"}}).Set(host_active);
  G(kBlocks, kBlocksHelp, {{"tier", "host"}, {"state", "cached_evictable"}})
      .Set(s.host_blocks_cached_evictable);
  const double usage = s.blocks_total > 0 ? static_cast<double>(device_active) / s.blocks_total : 0;
  G("kvserve_kv_block_usage_ratio", "Referenced device blocks / total", {{"tier", "device"}})
      .Set(usage);
  G("kvserve_kv_block_usage_ratio", "Referenced device blocks / total", {{"tier", "host"}})
      .Set(s.host_blocks_total > 0 ? static_cast<double>(host_active) / s.host_blocks_total : 0);
  G("kvserve_kv_token_usage_ratio",
    "Tokens held in referenced device blocks / token slots of the pool")
      .Set(s.blocks_total > 0 ? static_cast<double>(used_tokens) /
                                    (static_cast<double>(s.blocks_total) * block_size_)
                              : 0);
  G("kvserve_kv_fragmentation_slots", "Allocated token slots minus the tokens in them (device)")
      .Set(static_cast<double>(allocated_slots - used_tokens));
  G("kvserve_kv_bytes_per_block", "Bytes of one KV block per rank (data and scales)")
      .Set(s.kv_bytes_per_block);
  Add(C("kvserve_swap_blocks_total", "Blocks swapped", {{"direction", "out"}}), s.swap_out_blocks);
  Add(C("kvserve_swap_blocks_total", "Blocks swapped", {{"direction", "in"}}), s.swap_in_blocks);
  Add(C("kvserve_swap_bytes_total", "Bytes swapped per rank", {{"direction", "out"}}),
      s.swap_out_bytes);
  Add(C("kvserve_swap_bytes_total", "Bytes swapped per rank", {{"direction", "in"}}),
      s.swap_in_bytes);
  Add(C("kvserve_preemptions_total", "Preemptions by mode", {{"mode", "swap"}}),
      s.swap_preemptions);
  Add(C("kvserve_preemptions_total", "Preemptions by mode", {{"mode", "recompute"}}),
      s.recompute_preemptions);
  Add(C("kvserve_prefix_cache_queried_tokens_total", "Prompt tokens looked up in the prefix cache"),
      s.prefix_queried_tokens);
  Add(C("kvserve_prefix_cache_hit_tokens_total", "Prompt tokens found in the prefix cache",
        {{"tier", "device"}}),
      s.prefix_hit_tokens_device);
  Add(C("kvserve_prefix_cache_hit_tokens_total", "Prompt tokens found in the prefix cache",
        {{"tier", "host"}}),
      s.prefix_hit_tokens_host);
  constexpr const char* kConstraintsHelp = "Structured-outputs constraints by whether compiled";
  Add(C("kvserve_structured_constraints_total", kConstraintsHelp, {{"result", "compiled"}}),
      s.constraints_compiled);
  Add(C("kvserve_structured_constraints_total", kConstraintsHelp, {{"result", "cached"}}),
      s.constraints_reused);
  constexpr const char* kMasksHelp = "Structured-outputs token masks by whether computed";
  Add(C("kvserve_structured_masks_total", kMasksHelp, {{"result", "computed"}}),
      s.constraint_masks_walked);
  Add(C("kvserve_structured_masks_total", kMasksHelp, {{"result", "cached"}}),
      s.constraint_masks_reused);
  Add(C("kvserve_structured_mask_seconds_total", "Time computing token masks"),
      s.constraint_mask_seconds);
  Add(C("kvserve_jump_forward_tokens_total",
        "Generated tokens a constraint forced, appended without a draw (jump-forward decoding)"),
      s.jumped_tokens);
  Add(C("kvserve_kv_evictions_total", "Cached device blocks evicted"), s.evictions);
  Add(C("kvserve_kv_host_spilled_blocks_total", "Evicted device blocks saved to the host tier"),
      s.host_spilled_blocks);
  G("kvserve_kv_event_seq", "Sequence number of the last KV event batch")
      .Set(static_cast<double>(event_seq));
  G("kvserve_requests", "Requests by state", {{"state", "running"}}).Set(s.num_running);
  G("kvserve_requests", "Requests by state", {{"state", "waiting"}}).Set(s.num_waiting);
  G("kvserve_requests", "Requests by state", {{"state", "swapped"}}).Set(s.num_swapped);
  Add(C("kvserve_prompt_tokens_total", "Prompt tokens computed"), s.computed_prompt_tokens);
  constexpr const char* kStepsHelp = "Engine steps run, by whether they replayed a CUDA graph";
  Add(C("kvserve_engine_steps_total", kStepsHelp, {{"graph", "replayed"}}), s.graph_steps);
  Add(C("kvserve_engine_steps_total", kStepsHelp, {{"graph", "none"}}), s.steps - s.graph_steps);
  Add(C("kvserve_generation_tokens_total", "Tokens generated"), s.generated_tokens);
  G("kvserve_uptime_seconds", "Seconds since this process started").Set(uptime_seconds);
  G("kvserve_draining", "1 while draining").Set(draining ? 1 : 0);
  if (vllm_names_) UpdateVllm(s, usage);
}

// vLLM's names for the same quantities.
void WorkerMetrics::UpdateVllm(const EngineStats& s, double usage) {
  VllmG("vllm:num_requests_running", "Number of requests in model execution batches")
      .Set(s.num_running);
  VllmG("vllm:num_requests_waiting", "Number of requests waiting to be processed")
      .Set(s.num_waiting + s.num_swapped);
  VllmG("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage").Set(usage);
  Add(VllmC("vllm:prefix_cache_queries_total", "Prefix cache queries, in tokens"),
      s.prefix_queried_tokens);
  Add(VllmC("vllm:prefix_cache_hits_total", "Prefix cache hits, in tokens"), s.prefix_hit_tokens);
  Add(VllmC("vllm:num_preemptions_total", "Cumulative number of preemptions"), s.preemptions);
  Add(VllmC("vllm:prompt_tokens_total", "Number of prefill tokens processed"),
      s.computed_prompt_tokens);
  Add(VllmC("vllm:generation_tokens_total", "Number of generation tokens processed"),
      s.generated_tokens);
}

void WorkerMetrics::ObserveFinished(const FinishedRequest& r) {
  Observe(e2e_, r.e2e);
  Observe(queue_, r.queue);
  if (r.tpot > 0) Observe(tpot_, r.tpot);
  Observe(prefill_, r.prefill);
  Observe(decode_, r.decode);
  Observe(inference_, r.inference);
  Observe(prompt_tokens_, static_cast<double>(r.prompt_tokens));
  Observe(generation_tokens_, static_cast<double>(r.generation_tokens));
  Observe(params_n_, static_cast<double>(r.n));
  Observe(params_max_tokens_, static_cast<double>(r.max_tokens));
  CountRequestEnd(r.reason);
}

void WorkerMetrics::CountRequestEnd(const std::string& reason) { AddRequestEnds(reason, 1); }

void WorkerMetrics::AddRequestEnds(const std::string& reason, double n) {
  C("kvserve_requests_finished_total", "Requests ended, by finish reason",
    {{"finished_reason", reason}})
      .Increment(n);
  if (vllm_names_) {
    VllmC("vllm:request_success_total", "Count of successfully processed requests",
          {{"finished_reason", reason}})
        .Increment(n);
  }
}

void WorkerMetrics::StartRecycleCounts(const std::map<std::string, int64_t>& earlier) {
  for (const char* reason : {"requests", "uptime", "rss_growth", "fragmentation"}) {
    C("kvserve_recycles_total", "Planned recycles by reason", {{"reason", reason}});
  }
  for (const auto& [reason, n] : earlier) {
    C("kvserve_recycles_total", "Planned recycles by reason", {{"reason", reason}})
        .Increment(static_cast<double>(n));
  }
}

void WorkerMetrics::CountRecycle(const std::string& reason) {
  C("kvserve_recycles_total", "Planned recycles by reason", {{"reason", reason}}).Increment();
}

void WorkerMetrics::CountDropped(const std::string& reason) {
  C("kvserve_dropped_messages_total", "Malformed or unexpected messages dropped",
    {{"reason", reason}})
      .Increment();
}

prometheus::Counter& WorkerMetrics::KvCounter(const std::string& name, const std::string& direction,
                                              const std::string& format) {
  const bool blocks = name == "kvserve_kv_transfer_blocks_total";
  return C(name,
           blocks ? "KV blocks sent to or cached from peers (direction out or in), by KV format"
                  : "Wire bytes of KV blocks sent to or cached from peers, by KV format",
           {{"direction", direction}, {"format", format}});
}

prometheus::Histogram& WorkerMetrics::KvChunkSeconds(const std::string& direction) {
  static const prometheus::Histogram::BucketBoundaries kBuckets = {
      1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 1};
  if (kv_chunk_seconds_ == nullptr) {
    kv_chunk_seconds_ = &prometheus::BuildHistogram()
                             .Name("kvserve_kv_transfer_chunk_seconds")
                             .Help("Loop time to export or check and cache one chunk of KV blocks")
                             .Register(*registry_);
  }
  Labels all = base_;
  all["direction"] = direction;
  return kv_chunk_seconds_->Add(all, kBuckets);
}

void WorkerMetrics::StartKvTransfer(const std::string& format) {
  for (const char* direction : {"out", "in"}) {
    KvCounter("kvserve_kv_transfer_blocks_total", direction, format);
    KvCounter("kvserve_kv_transfer_bytes_total", direction, format);
    KvChunkSeconds(direction);
    for (std::string_view reason : kKvTransferFailureReasons) {
      CountKvTransferFailure(direction, std::string(reason), /*count=*/0);
    }
  }
}

void WorkerMetrics::ObserveKvChunk(const std::string& direction, const std::string& format,
                                   int64_t blocks, int64_t bytes, double seconds) {
  KvCounter("kvserve_kv_transfer_blocks_total", direction, format)
      .Increment(static_cast<double>(blocks));
  KvCounter("kvserve_kv_transfer_bytes_total", direction, format)
      .Increment(static_cast<double>(bytes));
  KvChunkSeconds(direction).Observe(seconds);
}

void WorkerMetrics::CountKvTransferFailure(const std::string& direction, const std::string& reason,
                                           int count) {
  C("kvserve_kv_transfer_failures_total", "KV chunks not exported (out) or refused (in), by reason",
    {{"direction", direction}, {"reason", reason}})
      .Increment(count);
}

void WorkerMetrics::UpdateAuthentications(int64_t accepted, int64_t refused) {
  const char* help = "ZeroMQ connections the CURVE handler accepted or refused";
  Add(C("kvserve_zmq_authentications_total", help, {{"result", "accepted"}}),
      static_cast<double>(accepted));
  Add(C("kvserve_zmq_authentications_total", help, {{"result", "refused"}}),
      static_cast<double>(refused));
}

void WorkerMetrics::UpdateVllmEvents(int64_t published, int64_t dropped) {
  const char* help = "vLLM-format KV-event batches published, or dropped on a full queue";
  Add(C("kvserve_vllm_kv_event_batches_total", help, {{"result", "published"}}),
      static_cast<double>(published));
  Add(C("kvserve_vllm_kv_event_batches_total", help, {{"result", "dropped"}}),
      static_cast<double>(dropped));
}

void WorkerMetrics::UpdateReplies(size_t waiting, int64_t waited, int64_t dropped) {
  G("kvserve_replies_waiting", "Replies waiting for a router peer that does not read fast enough")
      .Set(static_cast<double>(waiting));
  Add(C("kvserve_replies_waited_total",
        "Replies that waited because the router peer's send queue was full"),
      static_cast<double>(waited));
  Add(C("kvserve_replies_dropped_total",
        "Replies dropped because their router peer was gone or did not read for the give-up time "
        "(its requests are aborted)"),
      static_cast<double>(dropped));
}

std::string WorkerMetrics::Serialize() const {
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

}  // namespace kvserve::worker
