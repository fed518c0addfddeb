// Runs the model for the engine on one rank or on a tensor-parallel group of ranks. Each rank
// holds its shard of the weights (worker/model/model.h), its KV heads in a device pool and a
// host pool with the block ids every rank shares, a backend and a communicator. Rank 0 runs
// on the engine thread; ranks 1..N-1 are threads that execute exactly the plan rank 0 hands
// them (same batch, same block copies). A rank that errors or stalls makes the step fail
// within the collective timeout; the runner then stays failed and the worker stops.
//
//   ASSIGN_OR_RETURN(auto runner, ModelRunner::Create(config));
//   ASSIGN_OR_RETURN(ForwardOutput out, runner->Execute(copies, batch));
//
// Execute is called from the engine thread only.
#ifndef KVSERVE_WORKER_MODEL_RUNNER_H_
#define KVSERVE_WORKER_MODEL_RUNNER_H_

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/hf_config.h"
#include "common/kv_format.h"
#include "kernels/backend.h"
#include "kernels/communicator.h"
#include "worker/kv_cache/kv_cache_manager.h"
#include "worker/kv_cache/kv_storage.h"
#include "worker/model/model.h"

namespace kvserve::worker {

// Test aid: make one rank fail (or stall past the timeout) at a given step.
struct RankFault {
  int rank = -1;
  int64_t step = -1;
  bool stall = false;
};

struct RunnerConfig {
  std::string model_dir;
  ModelConfig model;
  KvCacheSpec kv_spec;
  // Device pool blocks per rank. 0 (CUDA only): as many as fit in gpu_memory_utilization of
  // each GPU's memory once the weights and the largest step's buffers are allocated, the same
  // count on every rank (the smallest).
  int num_blocks = 0;
  double gpu_memory_utilization = 0.9;
  int64_t max_step_tokens = 0;  // the largest step (tokens, logits rows) the buffers are sized for
  int64_t max_logit_rows = 0;
  int num_host_blocks = 0;
  int block_size = 16;
  int tensor_parallel_size = 1;
  int cpu_threads = 1;
  std::string device = "cpu";           // cpu | cuda
  bool attention_tensor_cores = false;  // CUDA: the mma.sync attention kernel
  // Decode steps of up to this many sequences replay CUDA graphs on every rank (0: off), whose
  // block tables are max_blocks_per_seq wide.
  int cuda_graph_max_batch = 0;
  int max_blocks_per_seq = 0;
  DType weight_type = DType::kF32;
  absl::Duration collective_timeout = absl::Seconds(60);
  RankFault fault;
  // Test aid: makes each rank's backend instead of the CPU backend (device "cpu" only).
  std::function<std::unique_ptr<kernels::Backend>()> make_backend;
};

class ModelRunner {
 public:
  static absl::StatusOr<std::unique_ptr<ModelRunner>> Create(const RunnerConfig& config);
  ~ModelRunner();

  // Applies the block copies (device→host, device→device, host→device, in that order) and
  // runs the batch on every rank; returns rank 0's output (the sampled tokens and the logits rows
  // asked for). After a rank fails, every call returns the first failure.
  absl::StatusOr<ForwardOutput> Execute(const BlockCopies& copies, const ForwardBatch& batch);

  // With CUDA graphs (cuda_graph_max_batch), before the first request: runs a placeholder
  // decode step per bucket (DecodeGraphs::Buckets; every rank), each recording its graph, so
  // that decode steps replay from the first one on. The placeholder rows write no KV. Returns
  // how many were recorded: 0 when there are more buckets than DecodeGraphs::kMaxGraphs, which
  // are then recorded on first use. Ends early once every rank ran out of device memory for
  // graphs (graphs_stopped).
  absl::StatusOr<int> RecordDecodeGraphs();
  // Why a rank's decode graphs stopped recording (out of device memory; the buckets left run
  // eagerly), naming the rank; OK when none did. Read between steps.
  [[nodiscard]] absl::Status graphs_stopped() const;

  [[nodiscard]] int size() const { return static_cast<int>(ranks_.size()); }
  [[nodiscard]] int num_blocks() const { return num_blocks_; }
  [[nodiscard]] int64_t weight_bytes(int rank) const { return ranks_[rank].model->weight_bytes(); }
  [[nodiscard]] KvStorage& device_kv(int rank) { return *ranks_[rank].device; }
  [[nodiscard]] kernels::Backend& backend(int rank) { return *ranks_[rank].backend; }
  [[nodiscard]] const KvStorage* host_kv(int rank) const { return ranks_[rank].host.get(); }
  [[nodiscard]] std::string_view communicator() const;

 private:
  struct Rank {
    std::unique_ptr<kernels::Backend> backend;
    std::unique_ptr<kernels::Communicator> comm;
    std::unique_ptr<Model> model;
    std::unique_ptr<KvStorage> device, host;
  };

  ModelRunner() = default;
  absl::StatusOr<ForwardOutput> RunRank(int rank, const BlockCopies& copies,
                                        const ForwardBatch& batch, int64_t step);
  void WorkerLoop(int rank);

  // Blocks of the device pools that fit in --gpu-memory-utilization (see RunnerConfig).
  absl::StatusOr<int> BlocksThatFit() const;

  RunnerConfig config_;
  std::vector<Rank> ranks_;
  int num_blocks_ = 0;
  std::vector<std::thread> workers_;

  // The step handed to ranks 1..N-1, guarded by mu_.
  std::mutex mu_;
  std::condition_variable cv_;
  int64_t step_ = 0;
  int64_t warmup_steps_ = 0;  // RecordDecodeGraphs' (RankFault counts the others)
  // The current step's plan, owned here so that a rank finishing late never reads a plan the
  // engine has already dropped.
  BlockCopies copies_;
  ForwardBatch batch_;
  std::vector<int64_t> done_;         // per rank: last step finished
  std::vector<absl::Status> status_;  // per rank: its result for done_
  bool stop_ = false;
  absl::Status failed_;  // sticky
};

}  // namespace kvserve::worker

#endif  // KVSERVE_WORKER_MODEL_RUNNER_H_
