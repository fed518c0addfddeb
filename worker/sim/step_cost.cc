#include "worker/sim/step_cost.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace kvserve::worker {

// Datasheet peaks (SXM parts): HBM bandwidth, dense bf16 tensor FLOP/s, PCIe (Gen5 x16 for
// Hopper, Gen4 x16 for Ampere, at what pinned copies reach).
absl::StatusOr<GpuProfile> GpuPreset(std::string_view name) {
  if (name == "h100") {
    return GpuProfile{.name = "h100",
                      .hbm_bytes_per_s = 3.35e12,
                      .dense_flops = 989e12,
                      .pcie_bytes_per_s = 50e9};
  }
  if (name == "h200") {
    return GpuProfile{
        .name = "h200", .hbm_bytes_per_s = 4.8e12, .dense_flops = 989e12, .pcie_bytes_per_s = 50e9};
  }
  if (name == "a100") {
    return GpuProfile{.name = "a100",
                      .hbm_bytes_per_s = 2.039e12,
                      .dense_flops = 312e12,
                      .pcie_bytes_per_s = 25e9};
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--sim-gpu '", std::string(name), "' is not one of ", std::string(GpuPresetNames())));
}

std::string_view GpuPresetNames() { return "h100, h200, a100"; }

SimModel SimModelOf(const ModelConfig& m, int weight_bytes, double kv_bytes_per_token) {
  const int64_t hidden = m.hidden_size, head_dim = m.head_dim;
  const int64_t q = int64_t{m.num_heads} * head_dim, kv = int64_t{m.num_kv_heads} * head_dim;
  const int64_t per_layer =
      hidden * q + 2 * hidden * kv + q * hidden + 3 * hidden * int64_t{m.intermediate_size};
  SimModel s;
  s.matmul_params = per_layer * m.num_layers;
  s.lm_head_params = hidden * m.vocab_size;
  s.weight_bytes = (s.matmul_params + s.lm_head_params) * weight_bytes;
  s.kv_bytes_per_token = kv_bytes_per_token;
  s.attention_width = int64_t{m.num_layers} * q;
  return s;
}

StepCost EstimateStep(const SimModel& model, const GpuProfile& gpu, const StepShape& step) {
  StepCost c;
  double tokens = 0, context = 0, attended = 0;
  for (size_t i = 0; i < step.query_len.size(); ++i) {
    const double q = step.query_len[i], after = step.context_len[i];
    tokens += q;
    context += after;
    // Causal: the new tokens see (after - q) cached ones plus those before them in the chunk.
    attended += q * (after - q) + q * (q + 1) / 2;
  }
  // Matmuls: 2 FLOPs per parameter per token; attention: QK^T and PV, 2 each per element.
  c.flops = 2.0 * static_cast<double>(model.matmul_params) * tokens +
            2.0 * static_cast<double>(model.lm_head_params) * static_cast<double>(step.logit_rows) +
            4.0 * static_cast<double>(model.attention_width) * attended;
  // The weights once, each sequence's cached context, the new rows written.
  c.bytes = static_cast<double>(model.weight_bytes) + model.kv_bytes_per_token * context +
            model.kv_bytes_per_token * tokens;
  c.compute_s = c.flops / (gpu.dense_flops * gpu.compute_efficiency);
  c.memory_s = c.bytes / (gpu.hbm_bytes_per_s * gpu.mem_efficiency);
  c.copy_s = static_cast<double>(step.copy_bytes) / gpu.pcie_bytes_per_s;
  c.seconds = std::max(c.compute_s, c.memory_s) + c.copy_s + gpu.step_overhead_s;
  return c;
}

}  // namespace kvserve::worker
