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

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/kv/kv_format.h"
#include "common/model/hf_config.h"
#include "kernels/backend.h"
#include "kernels/communicator.h"
#include "worker/engine_config.h"
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

// Test-only ways into the runner, kept apart from the serving configuration.
struct RunnerTestHooks {
  RankFault rank_fault;
  // Makes each rank's backend instead of the CPU backend (device kCpu only).
  std::function<std::unique_ptr<kernels::Backend>()> make_backend;
};

struct RunnerConfig {
  std::string model_dir;
  ModelConfig model;
  DType weight_type = DType::kF32;
  KvCacheSpec kv_spec;
  // The engine's; backend.cuda_graph_max_batch is the effective bound (at most a step's rows):
  // decode steps of up to that many sequences replay CUDA graphs on every rank (0: off).
  BackendConfig backend;
  ParallelConfig parallel;
  int block_size = 16;
  // Device pool blocks per rank. 0 (CUDA only): as many as fit in gpu_memory_utilization of
  // each GPU's memory once the weights and the largest step's buffers are allocated, the same
  // count on every rank (the smallest).
  int num_blocks = 0;
  int num_host_blocks = 0;
  int max_blocks_per_seq = 0;   // the block tables' width (decode graphs are recorded at it)
  int64_t max_step_tokens = 0;  // the largest step (tokens, logits rows) the buffers are sized for
  int64_t max_logit_rows = 0;
};

class ModelRunner {
 public:
  static absl::StatusOr<std::unique_ptr<ModelRunner>> Create(const RunnerConfig& config,
                                                             const RunnerTestHooks& hooks = {});
  // FailedPrecondition when rank r has no GPU r to run on (Create checks it too).
  static absl::Status CheckDevices(const BackendConfig& backend, const ParallelConfig& parallel);
  ~ModelRunner();

  // Applies the block copies (device→host, device→device, host→device, in that order) and
  // runs the batch on every rank; returns rank 0's output (the sampled tokens and the logits rows
  // asked for). After a rank fails, every call returns the first failure.
  absl::StatusOr<ForwardOutput> Execute(const BlockCopies& copies, const ForwardBatch& batch);
  // Completes an output Execute left in flight (ForwardBatch::async_results, one rank only):
  // waits for the step's results on rank 0. `batch` is that step's.
  void Collect(const ForwardBatch& batch, ForwardOutput& out);

  // Before the first request, with CUDA graphs: records each bucket's decode graph on every rank
  // by running a placeholder step that writes no KV. Returns how many were recorded (0 past
  // DecodeGraphs::kMaxGraphs buckets, which record on first use); stops once every rank is out
  // of device memory for graphs (graphs_stopped).
  absl::StatusOr<int> RecordDecodeGraphs();
  // Why a rank's decode graphs stopped recording (out of device memory; the buckets left run
  // eagerly), naming the rank; OK when none did. Read between steps.
  [[nodiscard]] absl::Status graphs_stopped() const;

  [[nodiscard]] int size() const { return static_cast<int>(ranks_.size()); }
  [[nodiscard]] int num_blocks() const { return num_blocks_; }
  [[nodiscard]] int64_t weight_bytes(int rank) const {
    return ranks_[rank].model != nullptr ? ranks_[rank].model->weight_bytes() : 0;
  }
  // Not on the modelless devices (null, sim), which allocate no KV pools (has_kv_pools).
  [[nodiscard]] KvStorage& device_kv(int rank) { return *ranks_[rank].device; }
  [[nodiscard]] bool has_kv_pools() const { return ranks_[0].device != nullptr; }
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
  // Steps of Create: the ranks' communicators (Gloo or NCCL), each rank's backend and weights,
  // and the KV pools (sized to fit --gpu-memory-utilization when num_blocks is 0).
  absl::Status ConnectRanks();
  absl::Status LoadRank(int r);
  absl::Status AllocatePools();
  absl::StatusOr<ForwardOutput> RunRank(int rank, const BlockCopies& copies,
                                        const ForwardBatch& batch, int64_t step);
  // --device null: a fixed token (the first id that is not an end of sequence) for every draw,
  // log-probability 0, zero logits.
  [[nodiscard]] ForwardOutput NullForward(const ForwardBatch& batch) const;
  // --device sim: the step's time on the simulated GPU, slept unless sim_sleep is off.
  double SimulateStep(const BlockCopies& copies, const ForwardBatch& batch) const;
  void WorkerLoop(int rank);

  // Blocks of the device pools that fit in --gpu-memory-utilization (see RunnerConfig).
  absl::StatusOr<int> BlocksThatFit() const;

  // Constant after Create.
  RunnerConfig config_;
  RunnerTestHooks hooks_;
  std::vector<Rank> ranks_;
  int num_blocks_ = 0;
  std::vector<std::thread> workers_;
  SimModel sim_model_;  // --device sim
  double sim_kv_bytes_per_token_ = 0;

  // Written by the engine thread between steps; read by the ranks during them.
  int64_t warmup_steps_ = 0;  // RecordDecodeGraphs' steps (RankFault counts the others)
  absl::Status failed_;       // sticky; engine thread only
  // The current step's plan, published with step_ under mu_ and read by every rank until it
  // reports the step done; Execute changes it only after every rank did (or after a failure,
  // when it never publishes again). Owned here so that a rank finishing late never reads a plan
  // the engine has already dropped.
  BlockCopies copies_;
  ForwardBatch batch_;

  // The handoff between the engine thread (rank 0) and ranks 1..N-1.
  absl::Mutex mu_;
  absl::CondVar cv_;  // signalled on a new step, a rank's result, and stop
  int64_t step_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<int64_t> done_ ABSL_GUARDED_BY(mu_);         // per rank: last step finished
  std::vector<absl::Status> status_ ABSL_GUARDED_BY(mu_);  // per rank: its result for done_
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace kvserve::worker

#endif  // KVSERVE_WORKER_MODEL_RUNNER_H_
