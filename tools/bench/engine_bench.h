// The offline engine benchmark behind `kvserve-bench engine` (vLLM's `bench throughput` and
// `bench latency` in one): for each KV cache dtype, one engine on the chosen device; for each
// batch × context, that many distinct prompts prefilled (tokens/s), then decoded in lock step
// (ms per step, tokens/s). A decode step must read the weights (bar the embedding table) and
// every sequence's KV; those bytes over the step's time, set against the device's copy
// bandwidth measured in the same run, say how close the whole step (GEMMs, attention,
// sampling, host work) comes to the memory roofline.
//
//   ASSIGN_OR_RETURN(EngineBenchReport r, RunEngineBench(options));
//   std::cout << FormatEngineBench(r);
#ifndef KVSERVE_TOOLS_BENCH_ENGINE_BENCH_H_
#define KVSERVE_TOOLS_BENCH_ENGINE_BENCH_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/hf_config.h"

namespace kvserve::bench {

struct EngineBenchRow {
  std::string kv_cache_dtype;
  std::string kv_format;  // what the engine made of it (KvFormat::Describe of layer 0's K)
  int batch = 0, context = 0;
  double prefill_s = 0;  // until every prompt is in the cache
  double prefill_tokens_per_s = 0;
  double decode_ms_per_step = 0;
  double decode_tokens_per_s = 0;
  double step_bytes = 0;  // read per decode step on rank 0: weights + KV
  double step_kv_bytes = 0;
  double gbps = 0;  // step_bytes per step time
  double fraction_of_copy = 0;
  int cuda_graph_max_batch = 0;   // the engine's --cuda-graph-max-batch
  int decode_gemv_max_batch = 0;  // the engine's --decode-gemv-max-batch
  bool async_scheduling = false;  // whether its steps ran ahead (Engine::async_scheduling)
  int graph_steps = 0;            // timed decode steps that replayed a CUDA graph
  double start_s = 0;  // the engine's start-up (Engine::Create: weights, pool, recorded graphs)
  // Of that start-up, the decode graphs' recording: seconds and device memory (Engine's
  // GraphRecording; 0 without graphs).
  double graph_record_s = 0;
  double graph_record_mib = 0;
  // The host's side of a timed decode step (the engine's step profile,
  // worker/model/step_profile.h): Step()'s wall time and the engine thread's CPU time in it, µs per
  // step, and each phase's share (StepPhase order). On a GPU the wall time includes the wait for
  // the device (the "download" phase); the CPU time does not count a blocking wait.
  double host_us_per_step = 0;
  double host_cpu_us_per_step = 0;
  std::vector<double> phase_us;  // per StepPhase
  // What the worker's loop adds around a step: Engine::stats() read once (its metrics, read at
  // each request's end), µs per step; and the KV events the step fired (prefix-cache stores
  // and evictions, each one the worker encodes and publishes).
  double metrics_us_per_step = 0;
  double kv_events_per_step = 0;
  // With EngineBenchOptions::op_times: the device's time per op over the timed window, µs and
  // calls per decode step, by op name (Backend::TakeOpTimes; empty on the CPU).
  struct OpUs {
    std::string op;
    double us_per_step = 0, calls_per_step = 0;
  };
  std::vector<OpUs> op_us;
};

struct EngineBenchOptions {
  std::string model_dir;
  std::string device = "cpu";  // cpu | cuda
  std::string dtype = "auto";  // weights, as --dtype
  std::string attention_kernel = "simt";
  // One engine per value (and per KV cache dtype), as --cuda-graph-max-batch: graphs off (0)
  // and on side by side.
  std::vector<int> cuda_graph_max_batches = {0};
  // One engine per value too, as --decode-gemv-max-batch (0: cuBLAS for every step).
  std::vector<int> decode_gemv_max_batches = {0};
  // One engine per value too: "auto" (the engine's default: on for CUDA with one rank), "on"
  // (also on the CPU and the null device, which gain nothing from it), "off".
  std::vector<std::string> async_scheduling = {"auto"};
  int cpu_threads = 1;
  int block_size = 16;
  std::vector<std::string> kv_cache_dtypes = {"auto"};  // as --kv-cache-dtype, per-token scales
  std::vector<int> batches = {1, 16};
  std::vector<int> contexts = {512};  // prompt tokens per sequence
  int warmup_steps = 2;
  int decode_steps = 16;
  int max_num_batched_tokens = 8192;  // prefill chunk budget per step
  uint64_t seed = 1;
  // As served (the worker's default): full blocks are hashed and cached, and fire KV events.
  bool prefix_caching = true;
  // Times each op of the timed window on rank 0's device (CUDA events around each op; the
  // step's ms then include the events' own cost: compare with a run without it).
  bool op_times = false;
  // Called with each row as it is measured (the CLI prints it at once, so that a run cut short
  // still shows what it measured).
  std::function<void(const EngineBenchRow&)> on_row;
};

struct EngineBenchReport {
  std::string device;
  double copy_gbps = 0;           // rank 0's device-to-device copy, read + write
  int64_t weight_bytes = 0;       // rank 0
  int64_t weight_bytes_read = 0;  // per decode step: all but the embedding table
  std::vector<EngineBenchRow> rows;
};

// The weights a decode step reads: all of them but the input embedding table (it gathers a row
// per token), which an untied model stores apart from the LM head. `weight_bytes` is what
// the rank holds; the table's share is taken by parameter count.
int64_t DecodeWeightBytes(const ModelConfig& config, int64_t weight_bytes);

// InvalidArgument for empty or non-positive lists and a context over the model's limit;
// Internal if a timed step did not decode the whole batch (a preemption: the pool is sized so
// that none happens).
absl::StatusOr<EngineBenchReport> RunEngineBench(const EngineBenchOptions& options);

// The rows' throughput table, their host time per decode step by phase, and (op_times) the
// device's time per op.
std::string FormatEngineBench(const EngineBenchReport& report);

}  // namespace kvserve::bench

#endif  // KVSERVE_TOOLS_BENCH_ENGINE_BENCH_H_
