// kvserve-plan: KV-cache capacity planner. From a Hugging Face config (--model) or explicit
// shapes, prints per KV format the bytes per token, per request and for --num-seqs requests of
// --seq-len tokens, the weights per GPU, the KV blocks that fit, and the largest batch of such
// requests that runs at once. With --json, one object per format (kv_cache_bytes,
// kv_bytes_per_token, ...).
//
//   kvserve-plan --num-layers 32 --num-kv-heads 8 --head-dim 128 --num-seqs 100 --seq-len 2048
//   kvserve-plan --model DIR --gpu-memory 80 --tensor-parallel-size 2 --kv-cache-dtype int8
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/strings/str_format.h"
#include "common/init.h"
#include "common/kv/kv_planner.h"
#include "common/model/hf_config.h"
#include "common/model/model_weights.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, model, "", "Model directory or config.json (shapes and parameter count)");
ABSL_FLAG(int32_t, num_layers, 0, "Decoder layers (without --model)");
ABSL_FLAG(int32_t, num_kv_heads, 0, "KV heads (without --model)");
ABSL_FLAG(int32_t, head_dim, 0, "Head dimension (without --model)");
ABSL_FLAG(int64_t, num_params, 0, "Parameter count for the weights (without --model)");
ABSL_FLAG(std::string, weight_dtype, "bf16", "Weight storage: bf16, fp16, fp8, int8, int4, fp32");
ABSL_FLAG(std::string, kv_cache_dtype, "all",
          "fp16, bf16, fp8_e4m3, int8, int4, or all for a table");
ABSL_FLAG(std::string, kv_quant_granularity, "per_token",
          "per_token, per_group, per_channel, or k:G,v:G");
ABSL_FLAG(int32_t, kv_quant_group_size, 128, "Channels per scale for per_group");
ABSL_FLAG(std::string, kv_full_precision_layers, "",
          "Layers kept at fp16: first:N, last:N, indices");
ABSL_FLAG(int64_t, num_seqs, 1, "Target concurrency: sequences");
ABSL_FLAG(int64_t, seq_len, 2048, "Tokens of context per sequence");
ABSL_FLAG(double, gpu_memory, 80, "GPU memory per device, GiB");
ABSL_FLAG(double, gpu_memory_utilization, 0.9, "Fraction of GPU memory kvserve may use");
ABSL_FLAG(double, activation_reserve_gib, 1.0, "Reserved for activations, GiB per GPU");
ABSL_FLAG(double, cuda_context_gib, 0.5, "Reserved for the CUDA context, GiB per GPU");
ABSL_FLAG(int32_t, tensor_parallel_size, 1, "GPUs the model is sharded over");
ABSL_FLAG(int32_t, block_size, 16, "Tokens per KV block");
ABSL_FLAG(bool, json, false, "One JSON object per KV format instead of the table");

namespace kvserve {
namespace {

std::string Human(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) bytes /= 1024, ++u;
  if (u == 0) return absl::StrFormat("%.0f %s", bytes, units[u]);
  return absl::StrFormat("%.2f %s", bytes, units[u]);
}

absl::StatusOr<double> WeightBytesPerParam(const std::string& dtype) {
  if (dtype == "bf16" || dtype == "fp16") return 2.0;
  if (dtype == "fp8" || dtype == "int8") return 1.0;
  if (dtype == "int4") return 0.5;
  if (dtype == "fp32") return 4.0;
  return absl::InvalidArgumentError("--weight-dtype must be bf16, fp16, fp8, int8, int4 or fp32");
}

absl::Status Run() {
  PlanInput in;
  const std::string model = absl::GetFlag(FLAGS_model);
  if (!model.empty()) {
    ASSIGN_OR_RETURN(ModelConfig c, LoadHfConfig(model));
    in.num_layers = c.num_layers;
    in.num_kv_heads = c.num_kv_heads;
    in.head_dim = c.head_dim;
    in.num_params = NumParams(c);
  } else {
    in.num_layers = absl::GetFlag(FLAGS_num_layers);
    in.num_kv_heads = absl::GetFlag(FLAGS_num_kv_heads);
    in.head_dim = absl::GetFlag(FLAGS_head_dim);
    in.num_params = absl::GetFlag(FLAGS_num_params);
    if (in.num_layers == 0 || in.num_kv_heads == 0 || in.head_dim == 0) {
      return absl::InvalidArgumentError(
          "give --model DIR, or --num-layers, --num-kv-heads and --head-dim");
    }
  }
  ASSIGN_OR_RETURN(in.weight_bytes_per_param,
                   WeightBytesPerParam(absl::GetFlag(FLAGS_weight_dtype)));
  in.quant.granularity = absl::GetFlag(FLAGS_kv_quant_granularity);
  in.quant.group_size = absl::GetFlag(FLAGS_kv_quant_group_size);
  in.quant.full_precision_layers = absl::GetFlag(FLAGS_kv_full_precision_layers);
  in.block_size = absl::GetFlag(FLAGS_block_size);
  in.tensor_parallel_size = absl::GetFlag(FLAGS_tensor_parallel_size);
  in.num_seqs = absl::GetFlag(FLAGS_num_seqs);
  in.seq_len = absl::GetFlag(FLAGS_seq_len);
  in.gpu_memory_gib = absl::GetFlag(FLAGS_gpu_memory);
  in.gpu_memory_utilization = absl::GetFlag(FLAGS_gpu_memory_utilization);
  in.activation_reserve_gib = absl::GetFlag(FLAGS_activation_reserve_gib);
  in.cuda_context_gib = absl::GetFlag(FLAGS_cuda_context_gib);

  std::vector<std::string> dtypes = {"fp16", "bf16", "fp8_e4m3", "int8", "int4"};
  const std::string want = absl::GetFlag(FLAGS_kv_cache_dtype);
  if (want != "all") dtypes = {want == "auto" ? "fp16" : want};
  const bool json = absl::GetFlag(FLAGS_json);
  if (!json) {
    std::cout << absl::StrFormat(
        "model: %d layers, %d KV heads x %d head_dim, %.2fB params; TP %d; %d x %d tokens; "
        "GPU %.0f GiB x %.2f\n",
        in.num_layers, in.num_kv_heads, in.head_dim, in.num_params / 1e9, in.tensor_parallel_size,
        in.num_seqs, in.seq_len, in.gpu_memory_gib, in.gpu_memory_utilization);
    std::cout << absl::StrFormat("%-24s %12s %12s %12s %12s %12s %10s %8s %5s\n", "kv format",
                                 "B/token", "per request", "total", "per layer/req", "weights/GPU",
                                 "blocks/GPU", "max conc", "fits");
  }
  for (const std::string& dtype : dtypes) {
    in.quant.dtype = dtype;
    ASSIGN_OR_RETURN(PlanResult r, PlanKvCache(in));
    if (json) {
      nlohmann::json j = {{"kv_format", r.kv_format},
                          {"kv_bytes_per_token", r.kv_bytes_per_token},
                          {"kv_bytes_per_token_per_rank", r.kv_bytes_per_token_per_rank},
                          {"kv_bytes_per_request", r.kv_bytes_per_request},
                          {"kv_bytes_per_layer_per_request", r.kv_bytes_per_layer_per_request},
                          {"kv_cache_bytes", r.kv_cache_bytes},
                          {"kv_heads_per_rank", r.kv_heads_per_rank},
                          {"kv_heads_replicated", r.kv_heads_replicated},
                          {"weight_bytes_per_rank", r.weight_bytes_per_rank},
                          {"kv_budget_bytes_per_rank", r.kv_budget_bytes_per_rank},
                          {"blocks_per_rank", r.blocks_per_rank},
                          {"max_concurrency", r.max_concurrency},
                          {"fits", r.fits}};
      std::cout << j.dump() << "\n";
    } else {
      std::cout << absl::StrFormat("%-24s %12s %12s %12s %12s %12s %10d %8d %5s\n", r.kv_format,
                                   Human(r.kv_bytes_per_token), Human(r.kv_bytes_per_request),
                                   Human(r.kv_cache_bytes), Human(r.kv_bytes_per_layer_per_request),
                                   Human(r.weight_bytes_per_rank), r.blocks_per_rank,
                                   r.max_concurrency, r.fits ? "yes" : "no");
    }
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace kvserve

int main(int argc, char** argv) {
  kvserve::InitProgram(argc, argv, "kvserve-plan: KV-cache capacity planner (see --help)");
  absl::Status s = kvserve::Run();
  if (!s.ok()) {
    std::cerr << "kvserve-plan: " << s.message() << "\n";
    return 1;
  }
  return 0;
}
