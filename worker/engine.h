// The worker's engine: a model, its paged KV cache, the scheduler and the sampler, driven one
// step at a time. The worker server and the tests drive it through this API.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(config));
//   RETURN_IF_ERROR(engine->AddRequest({.request_id = "r1", .prompt = ids, .max_tokens = 32}));
//   while (engine->HasWork()) {
//     ASSIGN_OR_RETURN(std::vector<SequenceOutput> outs, engine->Step());
//     ...  // new tokens per sample, finish reasons
//   }
//
// Owned by one thread (the engine thread); not thread-safe.
#ifndef KVSERVE_WORKER_ENGINE_H_
#define KVSERVE_WORKER_ENGINE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/kv_format.h"
#include "kernels/backend.h"
#include "worker/kv_cache/kv_cache_manager.h"
#include "worker/kv_cache/kv_storage.h"
#include "worker/model/model.h"
#include "worker/model_runner.h"
#include "worker/request.h"
#include "worker/scheduler/scheduler.h"

namespace kvserve::worker {

struct EngineConfig {
  std::string model_dir;
  std::string config_path;  // default: model_dir/config.json
  std::string model_id;     // block-hash extra key; default: model_dir's last component
  int block_size = 16;      // 8, 16 or 32
  int max_model_len = 0;    // 0: the model's max_position_embeddings
  bool enable_prefix_caching = true;
  double kv_cache_memory_gib = 0.5;     // KV pool size (CPU backend)
  double gpu_memory_utilization = 0.9;  // KV pool size (CUDA): this share of each GPU, all told
  int num_blocks = 0;                   // overrides both when > 0
  KvQuantOptions kv_quant;              // --kv-cache-dtype, granularity, group size, fp layers
  double swap_space_gib = 0.0;          // host tier for swapping and the host prefix cache
  int num_host_blocks = 0;              // overrides swap_space_gib when > 0
  bool host_prefix_cache = false;
  int cpu_threads = 1;
  std::string device = "cpu";  // cpu | cuda (rank r on GPU r)
  // Weights: auto (float32 on the CPU; on CUDA the checkpoint's 16-bit type, bfloat16 for a
  // float32 checkpoint), float32, bfloat16, float16.
  std::string dtype = "auto";
  // Paged attention on CUDA: simt (the measured default) or tensor-cores (mma.sync; fp16 /
  // bf16 / quantized caches at head_dim 64 or 128, else SIMT).
  std::string attention_kernel = "simt";
  // CUDA graphs: decode steps of up to this many sequences replay a recorded graph instead of
  // launching every kernel (one rank only; with tensor parallelism steps run eagerly). 0: off,
  // the default until a GPU run has timed and checked them.
  int cuda_graph_max_batch = 0;
  int tensor_parallel_size = 1;                   // ranks as threads, Gloo / NCCL between them
  absl::Duration tp_timeout = absl::Seconds(60);  // bound on every collective
  RankFault tp_fault;                             // test aid
  // Test aid: each rank's backend instead of the CPU backend (RunnerConfig::make_backend).
  std::function<std::unique_ptr<kernels::Backend>()> make_backend;
  SchedulerConfig scheduler;
};

struct SequenceOutput {
  std::string request_id;
  int sample_index = 0;
  std::vector<int32_t> new_tokens;
  std::vector<TokenLogprobs> new_logprobs;
  FinishReason finish_reason = FinishReason::kNone;
  std::optional<int32_t> stop_token;
  bool request_finished = false;  // every sample of the request is done
  int num_prompt_tokens = 0;
  int num_cached_prompt_tokens = 0;
  std::vector<float> prompt_logits;  // on the request's last output, when asked for
};

struct EngineStats {
  int64_t steps = 0;
  int64_t graph_steps = 0;      // steps that replayed a CUDA graph
  int64_t computed_tokens = 0;  // tokens run through the model (prefill, recompute, decode)
  int64_t computed_prompt_tokens = 0;
  int64_t generated_tokens = 0;
  int64_t prefix_queried_tokens = 0;
  int64_t prefix_hit_tokens = 0;
  int64_t prefix_hit_tokens_device = 0;
  int64_t prefix_hit_tokens_host = 0;
  int64_t preemptions = 0;
  int64_t swap_preemptions = 0;
  int64_t recompute_preemptions = 0;
  int64_t swap_out_blocks = 0, swap_in_blocks = 0;
  int64_t swap_out_bytes = 0, swap_in_bytes = 0;
  int64_t host_spilled_blocks = 0;
  int64_t cow_copies = 0;
  int64_t evictions = 0;
  int num_running = 0, num_waiting = 0, num_swapped = 0, num_requests = 0;
  int blocks_total = 0, blocks_free = 0, blocks_cached_evictable = 0;
  int host_blocks_total = 0, host_blocks_free = 0, host_blocks_cached_evictable = 0;
  int64_t kv_bytes_per_block = 0;
};

// The decode graphs recorded at start-up (--cuda-graph-max-batch), as the preflight report
// says: buckets, how many were recorded, how long it took and the device memory it took on
// rank 0 (graphs and the scratch memory their placeholder steps sized). When a GPU had no
// memory for the next graph, recording stopped there (`stopped` says why) and the buckets
// left run eagerly: the engine serves, with fewer graphs.
struct GraphRecording {
  int buckets = 0;
  int recorded = 0;
  double seconds = 0;
  double device_mib = 0;
  std::string stopped;  // empty unless recording stopped
};

class Engine {
 public:
  // Loads the model, sizes the KV pool and runs the preflight checks: InvalidArgument naming
  // the setting and its limit for impossible settings.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(const EngineConfig& config);

  // InvalidArgument (engine unchanged) for an empty prompt, ids outside the vocabulary,
  // max_tokens < 1, prompt + max_tokens over max_model_len, bad sampling parameters;
  // AlreadyExists for a request id in flight.
  absl::Status AddRequest(RequestInput input);
  // Stops a request at any point and frees its blocks. NotFound for an unknown id.
  absl::Status Abort(const std::string& request_id);
  absl::StatusOr<std::vector<SequenceOutput>> Step();
  [[nodiscard]] bool HasWork() const { return !requests_.empty(); }

  [[nodiscard]] EngineStats stats() const;
  // The memory budget, as printed at start-up.
  [[nodiscard]] const std::string& preflight_report() const { return preflight_; }
  [[nodiscard]] const GraphRecording& graph_recording() const { return graph_recording_; }
  [[nodiscard]] const ModelConfig& model_config() const { return model_config_; }
  [[nodiscard]] const EngineConfig& config() const { return config_; }
  [[nodiscard]] ModelRunner& runner() { return *runner_; }
  [[nodiscard]] int max_model_len() const { return max_model_len_; }
  [[nodiscard]] int num_blocks() const { return num_blocks_; }

  // Device token slots of referenced blocks and the tokens in them (shared blocks counted once).
  struct KvUsage {
    int64_t allocated_slots = 0;
    int64_t used_tokens = 0;
  };
  [[nodiscard]] KvUsage kv_usage() const;
  // Every (block hash, medium) now in the prefix cache, for KV-event snapshots.
  void ForEachCachedBlock(const std::function<void(const BlockHash&, Medium)>& fn) const;
  // Ends every request (finish reason abort) and frees its blocks; returns their ids.
  std::vector<std::string> AbortAll();
  // Whether a request has been scheduled at least once (queue-time metrics). Unknown or
  // finished ids count as started.
  [[nodiscard]] bool Started(const std::string& request_id) const;

  // Test hooks: the invariant checker over every live sequence, and forced preemption.
  [[nodiscard]] absl::Status CheckInvariants() const;
  bool ForcePreemption() { return scheduler_->PreemptOne(); }
  [[nodiscard]] const KvCacheManager& kv_cache() const { return *kv_; }
  [[nodiscard]] KvCacheManager& mutable_kv_cache() { return *kv_; }
  [[nodiscard]] const KvCacheSpec& kv_spec() const { return kv_spec_; }
  // Rank 0's device pool (tests compare layers bit for bit).
  [[nodiscard]] KvStorage& device_kv() { return runner_->device_kv(0); }

 private:
  Engine() = default;
  absl::Status Validate(const RequestInput& in) const;
  void UpdateHashes(Sequence& seq);
  void FinishSequence(Sequence& seq, FinishReason reason, std::vector<SequenceOutput>* outs);
  // `logprobs`: the token's, when the request wants them (else null).
  void AppendToken(Sequence& seq, int32_t token, const TokenLogprobs* logprobs);
  // Makes the request's n - 1 further samples and appends the first token to each;
  // tokens[i] is sample i's (drawn with seed rng_seed + i), logprobs[i] its logprobs (or null).
  void Fork(Request& req, absl::Span<const int32_t> tokens, const TokenLogprobs* logprobs);

  EngineConfig config_;
  ModelConfig model_config_;
  std::unique_ptr<ModelRunner> runner_;
  KvCacheSpec kv_spec_;
  std::unique_ptr<KvCacheManager> kv_;
  std::unique_ptr<Scheduler> scheduler_;
  absl::flat_hash_map<std::string, std::unique_ptr<Request>> requests_;
  std::vector<int> eos_ids_;
  int max_model_len_ = 0;
  int num_blocks_ = 0;
  int64_t next_arrival_ = 0;
  int64_t next_seq_id_ = 0;
  std::string preflight_;
  GraphRecording graph_recording_;
  EngineStats counters_;
};

}  // namespace kvserve::worker

#endif  // KVSERVE_WORKER_ENGINE_H_
