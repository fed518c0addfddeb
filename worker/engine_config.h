// The engine's settings, grouped as vLLM groups them: the model, the KV cache, the backend that
// runs the model, tensor parallelism and the scheduler. kvserve-worker and kvserve-run fill it
// from flags (worker/engine_flags.h); tests and tools fill it directly.
//
//   EngineConfig config;
//   config.model_dir = "/models/llama";
//   config.backend.device = Device::kCuda;
//   RETURN_IF_ERROR(config.Validate());  // Engine::Create validates too
//
// Errors name the flag that sets the offending field (--block-size, --device, ...).
#ifndef KVSERVE_WORKER_ENGINE_CONFIG_H_
#define KVSERVE_WORKER_ENGINE_CONFIG_H_

#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/kv/kv_format.h"
#include "common/model/dtype.h"
#include "common/model/hf_config.h"
#include "worker/scheduler/scheduler.h"
#include "worker/sim/step_cost.h"

namespace kvserve::worker {

// kNull runs no model: the weights are not read and every step draws a fixed token at once, on
// the CPU backend's pools. The worker's server, scheduler, KV accounting and protocol are real,
// which makes it the load for measuring the router on its own (docs/RELIABILITY.md).
// kNull: no model, a fixed token at once; kSim: the same, each step taking the time a named GPU
// would (worker/sim/step_cost.h).
enum class Device { kCpu, kCuda, kNull, kSim };
// The weights' type: kAuto is float32 on the CPU backend; on CUDA the checkpoint's 16-bit type
// (bfloat16 for a float32 checkpoint).
enum class WeightDtype { kAuto, kFloat32, kBFloat16, kFloat16 };
// CUDA paged attention: SIMT (the measured default), mma.sync tensor cores (fp16 / bf16 /
// quantized caches at head_dim 64 or 128; other shapes stay SIMT), or pipelined (decode steps
// on the pipelined tensor-core kernel where it covers the cache, other steps as tensor-cores).
enum class AttentionKernel { kSimt, kTensorCores, kPipelined };

// Flag spellings ("cpu", "cuda", "null"; "auto", "float32", "float", "bfloat16", "float16", "half";
// "simt", "tensor-cores", "pipelined"). InvalidArgument naming the flag and the choices.
absl::StatusOr<Device> ParseDevice(std::string_view name);
absl::StatusOr<WeightDtype> ParseWeightDtype(std::string_view name);
absl::StatusOr<AttentionKernel> ParseAttentionKernel(std::string_view name);
std::string_view DeviceName(Device device);
// null and sim: no weights are read and no model runs.
inline bool IsModelless(Device device) { return device == Device::kNull || device == Device::kSim; }

// The paged KV cache: block geometry, pool sizes, quantization and the host tier.
struct CacheConfig {
  int block_size = 16;  // 8, 16 or 32
  bool enable_prefix_caching = true;
  double kv_cache_memory_gib = 0.5;  // device pool size on the CPU backend
  int num_blocks = 0;                // device pool size in blocks; overrides the sizes when > 0
  // Device pool size in bytes per rank on any backend (vLLM's --kv-cache-memory-bytes; on the
  // GPU it replaces --gpu-memory-utilization's share); 0: unset. --num-blocks wins over it.
  int64_t kv_cache_memory_bytes = 0;
  KvQuantOptions kv_quant;         // --kv-cache-dtype, granularity, group size, fp layers
  double swap_space_gib = 0.0;     // host tier for swapping and the host prefix cache
  int num_host_blocks = 0;         // overrides swap_space_gib when > 0
  bool host_prefix_cache = false;  // spill evicted prefix blocks to the host tier
};

// What runs the model on each rank. Shared with the model runner (RunnerConfig).
struct BackendConfig {
  Device device = Device::kCpu;  // kCuda: tensor-parallel rank r on GPU r
  int cpu_threads = 1;           // the CPU backend's GEMM threads
  // CUDA: the share of each GPU the engine may take in all (weights, buffers, KV pool); the pool
  // gets what is left after loading.
  double gpu_memory_utilization = 0.9;
  AttentionKernel attention_kernel = AttentionKernel::kSimt;
  // CUDA graphs: decode steps of up to this many sequences replay a recorded graph. 0: off, the
  // default until a GPU run has timed and checked them.
  int cuda_graph_max_batch = 0;
  // Steps of up to this many tokens (at most 8) with 16-bit weights run each layer's
  // projections with the norms and the SiLU·mul fused in (Backend::DecodeGemv): 6 launches a
  // layer instead of 9. 0: off, the default until a GPU run has timed it against cuBLAS.
  int decode_gemv_max_batch = 0;
  // --device sim: the GPU it stands for, and whether a step sleeps for its time (false: the
  // time is only reported, in ForwardOutput::sim_seconds, for a simulator's virtual clock).
  GpuProfile sim_gpu;
  bool sim_sleep = true;
};

// Tensor parallelism: ranks as threads, Gloo (CPU) or NCCL (CUDA) between them. Shared with the
// model runner.
struct ParallelConfig {
  int tensor_parallel_size = 1;
  absl::Duration collective_timeout = absl::Seconds(60);  // bound on every collective
};

// Async scheduling (vLLM's --async-scheduling): the next step is planned and queued while the
// device runs the current one, the drawn tokens reaching the next step's inputs on the device
// and the host one step later. kAuto: on where it hides host work (--device cuda, one
// tensor-parallel rank); kOn: wherever it can run (one rank; the CPU, null and sim devices gain
// nothing from it, which tests use); kOff: never.
enum class AsyncScheduling { kAuto, kOn, kOff };

struct EngineConfig {
  std::string model_dir;
  std::string config_path;  // default: model_dir/config.json
  std::string model_id;     // block-hash extra key; default: model_dir's last component
  int max_model_len = 0;    // 0: the model's max_position_embeddings
  WeightDtype dtype = WeightDtype::kAuto;
  CacheConfig cache;
  BackendConfig backend;
  ParallelConfig parallel;
  SchedulerConfig scheduler;
  // --scheduling-policy priority: requests' priorities order the waiting queue (lower first);
  // fcfs (vLLM's default): arrival order, and a request with a priority is refused.
  bool priority_scheduling = false;
  // --seed: requests without a seed draw theirs from a generator seeded with it, so that a
  // replayed workload gives the same outputs; unset: each such request gets a random seed.
  std::optional<uint64_t> seed;
  AsyncScheduling async_scheduling = AsyncScheduling::kAuto;
  // Jump-forward decoding: text a request's constraint forces is appended without a draw and
  // computed in the next step (Engine::JumpForward; requests that ask for logprobs draw every
  // token).
  bool jump_forward = true;

  // Checks the settings among themselves: ranges, and options that need another (CUDA graphs
  // need CUDA, swap preemption needs a host tier). InvalidArgument naming the flag.
  [[nodiscard]] absl::Status Validate() const;
  // Checks them against the model: --max-model-len within its positions, heads that shard over
  // --tensor-parallel-size, attention kvserve implements. InvalidArgument naming the flag or
  // the config file.
  [[nodiscard]] absl::Status ValidateForModel(const ModelConfig& model) const;
  // The weights' type on this backend for this checkpoint.
  [[nodiscard]] DType WeightType(const ModelConfig& model) const;
  [[nodiscard]] std::string ConfigPath() const;
};

}  // namespace kvserve::worker

#endif  // KVSERVE_WORKER_ENGINE_CONFIG_H_
