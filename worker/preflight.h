// The engine's start-up budget: sizes the KV pools from the settings and the machine, checks
// that the pool holds the longest sequence, records the CUDA decode graphs, and writes the
// report kvserve-worker prints before serving.
//
//   ASSIGN_OR_RETURN(PoolPlan pools, PlanPools(config, kv_spec, model));
//   ... ModelRunner::Create with pools.device_blocks ...
//   RETURN_IF_ERROR(CheckPoolHoldsLongestSequence(config, runner->num_blocks(), max_model_len));
//   ASSIGN_OR_RETURN(GraphRecording graphs, RecordDecodeGraphs(*runner));
//   std::string report = PreflightReport({...});
//
// Engine thread (start-up) only.
#ifndef KVSERVE_WORKER_PREFLIGHT_H_
#define KVSERVE_WORKER_PREFLIGHT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/kv/kv_format.h"
#include "common/model/hf_config.h"
#include "worker/engine_config.h"
#include "worker/model_runner.h"

namespace kvserve::worker {

// The KV pools per rank (each rank stores only its KV heads).
struct PoolPlan {
  int64_t block_bytes = 0;  // one block of one rank: data and scales
  // Device blocks: --num-blocks, or what --kv-cache-memory-gib holds (CPU); 0 on CUDA without
  // --num-blocks: the runner measures what fits once the weights are loaded.
  int device_blocks = 0;
  int host_blocks = 0;  // --num-host-blocks, or what --swap-space holds
  [[nodiscard]] bool sized_by_gpu() const { return device_blocks == 0; }
};

// InvalidArgument naming the flag: a pool that holds no block, a host tier over 70% of the
// machine's memory, or an option that needs a host tier without one.
absl::StatusOr<PoolPlan> PlanPools(const EngineConfig& config, const KvCacheSpec& kv_spec,
                                   const ModelConfig& model);

// InvalidArgument when `num_blocks` blocks cannot hold one sequence of `max_model_len` tokens,
// saying which flags would make room.
absl::Status CheckPoolHoldsLongestSequence(const EngineConfig& config, const PoolPlan& pools,
                                           int num_blocks, int max_model_len);

// The decode graphs recorded at start-up (--cuda-graph-max-batch): buckets, how many were
// recorded, how long it took and the device memory it took on rank 0 (graphs and the scratch
// memory their placeholder steps sized). When a GPU had no memory for the next graph,
// recording stopped there (`stopped` says why) and the buckets left run eagerly: the engine
// serves, with fewer graphs.
struct GraphRecording {
  int max_batch = 0;  // the effective --cuda-graph-max-batch; 0: no graphs
  int buckets = 0;
  int recorded = 0;
  double seconds = 0;
  double device_mib = 0;
  std::string stopped;  // empty unless recording stopped
};

// Records the runner's decode graphs when its backend config asks for them.
absl::StatusOr<GraphRecording> RecordDecodeGraphs(ModelRunner& runner,
                                                  const RunnerConfig& runner_config);

// What the report states; every reference must outlive the call.
struct PreflightFacts {
  const EngineConfig& config;  // with model_id filled in
  const ModelConfig& model;
  const KvCacheSpec& kv_spec;
  ModelRunner& runner;
  const PoolPlan& pools;
  const GraphRecording& graphs;
  DType weight_type;
  int num_blocks = 0;
  int max_model_len = 0;
};

// The memory budget, as kvserve-worker prints it at start-up ("kvserve preflight: ...").
std::string PreflightReport(const PreflightFacts& facts);

}  // namespace kvserve::worker

#endif  // KVSERVE_WORKER_PREFLIGHT_H_
