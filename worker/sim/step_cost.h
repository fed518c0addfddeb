// The simulated GPU (`--device sim`): what one engine step would take on a named GPU, from the
// model's shape and the step's batch, by a roofline: the step is bound by whichever is slower,
// reading its bytes from HBM (the weights once, every sequence's KV context, the new KV rows)
// or doing its FLOPs (the matmuls for every token, attention over each new token's context),
// each at an efficiency of the peak; plus block copies over PCIe and a fixed step overhead
// (launches, sampling, the scheduler's turn on the host).
//
//   ASSIGN_OR_RETURN(GpuProfile gpu, GpuPreset("h200"));
//   SimModel model = SimModelOf(model_config, /*weight_bytes=*/2, kv_bytes_per_token);
//   StepCost c = EstimateStep(model, gpu, {.query_len = q, .context_len = ctx});
//
// Pure functions; any thread. docs/ROUTING.md compares them with docs/gpu-runs/.
#ifndef KVSERVE_WORKER_SIM_STEP_COST_H_
#define KVSERVE_WORKER_SIM_STEP_COST_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/model/hf_config.h"

namespace kvserve::worker {

struct GpuProfile {
  std::string name;
  double hbm_bytes_per_s = 0;   // peak HBM bandwidth
  double dense_flops = 0;       // peak dense bf16 tensor-core FLOP/s
  double pcie_bytes_per_s = 0;  // host <-> device copies
  double mem_efficiency = 0.7;  // share of peak bandwidth a step's reads reach
  double compute_efficiency = 0.5;
  double step_overhead_s = 200e-6;
};

// "h100" (SXM, 80 GB), "h200" (SXM, 141 GB), "a100" (SXM, 80 GB); InvalidArgument naming the
// others.
absl::StatusOr<GpuProfile> GpuPreset(std::string_view name);
std::string_view GpuPresetNames();

struct SimModel {
  int64_t matmul_params = 0;  // per token: attention projections and MLP of every layer
  int64_t lm_head_params = 0;
  int64_t weight_bytes = 0;       // read once per step
  double kv_bytes_per_token = 0;  // every layer's K and V
  int64_t attention_width = 0;    // layers × query heads × head_dim
};

// The shape of `model` with weights of `weight_bytes` bytes per parameter and a KV cache of
// `kv_bytes_per_token` (KvCacheSpec::BytesPerToken).
SimModel SimModelOf(const ModelConfig& model, int weight_bytes, double kv_bytes_per_token);

struct StepShape {
  absl::Span<const int32_t> query_len;    // new tokens of each sequence in the step
  absl::Span<const int32_t> context_len;  // tokens in its cache after the step
  int64_t logit_rows = 0;                 // rows through the LM head
  int64_t copy_bytes = 0;                 // swap traffic over PCIe
};

struct StepCost {
  double flops = 0, bytes = 0;
  double compute_s = 0, memory_s = 0, copy_s = 0;
  double seconds = 0;  // max(compute_s, memory_s) + copy_s + step_overhead_s
};

StepCost EstimateStep(const SimModel& model, const GpuProfile& gpu, const StepShape& step);

}  // namespace kvserve::worker

#endif  // KVSERVE_WORKER_SIM_STEP_COST_H_
