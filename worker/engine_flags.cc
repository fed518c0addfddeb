#include "worker/engine_flags.h"

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/init.h"
#include "common/status_macros.h"

ABSL_FLAG(std::string, model, "",
          "Model directory (Hugging Face layout: config.json, *.safetensors)");
ABSL_FLAG(std::string, hf_config, "", "config.json to use instead of MODEL/config.json");
ABSL_FLAG(std::string, served_model_name, "",
          "Model id in the block-hash key (default: the directory name)");
ABSL_FLAG(int32_t, block_size, 16, "Tokens per KV block: 8, 16 or 32");
ABSL_FLAG(int32_t, max_num_seqs, 256,
          "Most sequences in one batch; also the rows of logits a step computes (reserved at "
          "start-up), so that prompt logits are prefilled in chunks of at most this many tokens");
ABSL_FLAG(int32_t, max_num_batched_tokens, 2048, "Token budget of one engine step");
ABSL_FLAG(int32_t, max_model_len, 0,
          "Longest prompt + output (0: the model's max_position_embeddings)");
ABSL_FLAG(bool, enable_prefix_caching, true, "Share KV blocks of identical prefixes");
ABSL_FLAG(double, kv_cache_memory_gib, 0.5, "KV pool size in GiB (CPU backend)");
ABSL_FLAG(double, gpu_memory_utilization, 0.9,
          "Fraction of GPU memory for weights, activations and the KV pool (CUDA backend; the "
          "CPU backend sizes its pool with --kv-cache-memory-gib)");
ABSL_FLAG(int32_t, num_blocks, 0, "KV pool size in blocks (overrides --kv-cache-memory-gib)");
ABSL_FLAG(int32_t, cpu_threads, 1, "Threads for the CPU backend's GEMMs");
ABSL_FLAG(std::string, device, "cpu",
          "cpu, cuda (tensor-parallel rank r on GPU r, NCCL between ranks; needs a CUDA build), or "
          "null (no model: a fixed token at once, the weights not read; for measuring the "
          "router), or sim (null whose steps take the time --sim-gpu would: a roofline from the "
          "model's shape; for routing studies and capacity plans without a GPU)");
ABSL_FLAG(std::string, sim_gpu, "h200", "--device sim: the GPU it stands for: h100, h200, a100");
ABSL_FLAG(double, sim_hbm_gbps, 0, "--device sim: HBM bandwidth in GB/s (0: the preset's)");
ABSL_FLAG(double, sim_tflops, 0, "--device sim: dense bf16 TFLOP/s (0: the preset's)");
ABSL_FLAG(double, sim_mem_efficiency, 0.7, "--device sim: share of peak bandwidth a step reaches");
ABSL_FLAG(double, sim_compute_efficiency, 0.5, "--device sim: share of peak FLOP/s a step reaches");
ABSL_FLAG(double, sim_step_overhead_us, 200,
          "--device sim: fixed time of every step, microseconds");
ABSL_FLAG(std::string, dtype, "auto",
          "Weight type: auto (float32 on the CPU backend; on CUDA the checkpoint's 16-bit type, "
          "bfloat16 for a float32 checkpoint), float32, bfloat16, float16");
ABSL_FLAG(std::string, attention_kernel, "simt",
          "CUDA paged attention: simt, tensor-cores (mma.sync for fp16 / bf16 / fp8 / int8 / "
          "int4 caches at head_dim 64 or 128; other shapes stay SIMT), or pipelined (decode "
          "steps on the cp.async-pipelined tensor-core kernel: fp16 / bf16 and per-token fp8 / "
          "int8 / int4 at head_dim 64, 128 or 256, up to 8 query rows per KV head; other steps "
          "as tensor-cores)");
ABSL_FLAG(int32_t, cuda_graph_max_batch, 0,
          "CUDA graphs: decode steps of up to this many sequences replay a graph (one per batch "
          "and context bucket, recorded at start-up) instead of launching each kernel, NCCL "
          "collectives included with --tensor-parallel-size > 1; 0: off. Needs --device cuda");
ABSL_FLAG(
    int32_t, decode_gemv_max_batch, 0,
    "CUDA, 16-bit weights: steps of up to this many tokens (at most 8) run each layer's "
    "projections as matrix-vector kernels with the RMSNorms and the SiLU-mul fused in (6 "
    "launches a layer instead of 9); 0: off (cuBLAS). Needs --device cuda and 16-bit weights");
ABSL_FLAG(std::string, kv_cache_dtype, "auto",
          "KV cache element type: auto (the weights' type: fp32 on the CPU backend, bf16 / fp16 on "
          "CUDA), fp16, bf16, fp8_e4m3, int8, int4");
ABSL_FLAG(std::string, kv_quant_granularity, "per_token",
          "Scale granularity of fp8/int8/int4: per_token, per_group, per_channel, or "
          "k:GRAN,v:GRAN (e.g. k:per_channel,v:per_token, the known-good 4-bit recipe)");
ABSL_FLAG(int32_t, kv_quant_group_size, 128,
          "Channels per scale for per_group (8..128, divides head_dim)");
ABSL_FLAG(std::string, kv_full_precision_layers, "",
          "Layers kept unquantized: first:N, last:N and/or indices, comma-separated");
ABSL_FLAG(int32_t, tensor_parallel_size, 1,
          "Ranks (threads, one per device) that shard the KV heads, Gloo between them on the CPU");
ABSL_FLAG(double, tp_timeout_seconds, 60, "Bound on every tensor-parallel collective");
ABSL_FLAG(std::string, tp_fault_injection, "",
          "Testing aid: RANK:STEP:error or RANK:STEP:stall makes that rank fail at that step");
ABSL_FLAG(double, swap_space, 0.0, "Host tier in GiB for swapping and the host prefix cache");
ABSL_FLAG(std::string, preemption_mode, "auto",
          "auto (swap when the host tier has room, else recompute), swap or recompute");
ABSL_FLAG(bool, host_prefix_cache, false,
          "Move prefix blocks evicted from the device pool to the host tier (needs --swap-space)");
ABSL_FLAG(int32_t, long_prefill_token_threshold, 0,
          "Prompts longer than this are long: they prefill at most this many tokens per step "
          "(0: off)");
ABSL_FLAG(int32_t, max_num_partial_prefills, 0, "Most prefilling sequences per step (0: no cap)");
ABSL_FLAG(int32_t, max_long_partial_prefills, 1, "Most long prompts prefilling at once");
// vLLM's engine flags, with vLLM's meaning (docs/ROUTER.md, "Moving from vLLM").
ABSL_FLAG(bool, enforce_eager, false,
          "Never record CUDA graphs (vLLM's flag; wins over --cuda-graph-max-batch)");
ABSL_FLAG(std::string, seed, "",
          "Requests without a seed draw theirs from a generator seeded with this, so that a "
          "replayed workload gives the same outputs (empty: a random seed each)");
ABSL_FLAG(bool, async_scheduling, true,
          "Plan and queue the next step while the GPU runs the current one (on with --device "
          "cuda and one tensor-parallel rank; false: each step waits for the last)");
ABSL_FLAG(bool, jump_forward, true,
          "Structured outputs: text the constraint forces (a tool call's name and keys, a "
          "schema's keys) is appended without sampling and computed in one step (SGLang's "
          "jump-forward decoding); requests that ask for logprobs sample every token");
ABSL_FLAG(std::string, scheduling_policy, "fcfs",
          "fcfs (arrival order; a request with a priority is refused) or priority (lower "
          "priority values first, then arrival)");
ABSL_FLAG(int32_t, num_gpu_blocks_override, 0, "vLLM's name for --num-blocks");
ABSL_FLAG(int64_t, kv_cache_memory_bytes, 0,
          "KV pool size in bytes per rank on any device, instead of --gpu-memory-utilization's "
          "share or --kv-cache-memory-gib (0: unset)");
ABSL_FLAG(bool, enable_chunked_prefill, true,
          "Prefill prompts in chunks of the step budget: kvserve always does "
          "(--no-enable-chunked-prefill is refused)");

namespace kvserve::worker {
namespace {

absl::StatusOr<PreemptionMode> ParsePreemptionMode(const std::string& mode) {
  if (mode == "auto") return PreemptionMode::kAuto;
  if (mode == "swap") return PreemptionMode::kSwap;
  if (mode == "recompute") return PreemptionMode::kRecompute;
  return absl::InvalidArgumentError(
      absl::StrCat("--preemption-mode '", mode, "' is not one of auto, swap, recompute"));
}

absl::StatusOr<CacheConfig> CacheConfigFromFlags() {
  CacheConfig c;
  c.block_size = absl::GetFlag(FLAGS_block_size);
  c.enable_prefix_caching = absl::GetFlag(FLAGS_enable_prefix_caching);
  c.kv_cache_memory_gib = absl::GetFlag(FLAGS_kv_cache_memory_gib);
  c.kv_cache_memory_bytes = absl::GetFlag(FLAGS_kv_cache_memory_bytes);
  if (c.kv_cache_memory_bytes < 0) {
    return absl::InvalidArgumentError("--kv-cache-memory-bytes must be >= 0");
  }
  c.num_blocks = absl::GetFlag(FLAGS_num_blocks);
  const int override_blocks = absl::GetFlag(FLAGS_num_gpu_blocks_override);
  if (override_blocks != 0) {
    if (c.num_blocks != 0 && c.num_blocks != override_blocks) {
      return absl::InvalidArgumentError(absl::StrCat("--num-gpu-blocks-override (", override_blocks,
                                                     ") and --num-blocks (", c.num_blocks,
                                                     ") disagree; they are the same setting"));
    }
    c.num_blocks = override_blocks;
  }
  c.kv_quant.dtype = absl::GetFlag(FLAGS_kv_cache_dtype);
  c.kv_quant.granularity = absl::GetFlag(FLAGS_kv_quant_granularity);
  c.kv_quant.group_size = absl::GetFlag(FLAGS_kv_quant_group_size);
  c.kv_quant.full_precision_layers = absl::GetFlag(FLAGS_kv_full_precision_layers);
  c.swap_space_gib = absl::GetFlag(FLAGS_swap_space);
  c.host_prefix_cache = absl::GetFlag(FLAGS_host_prefix_cache);
  return c;
}

namespace {

// The --sim-* flags: the preset with its overrides, for --device sim; refused by name for any
// other device, which would ignore them.
absl::StatusOr<GpuProfile> SimGpuFromFlags(Device device) {
  const double hbm = absl::GetFlag(FLAGS_sim_hbm_gbps), tflops = absl::GetFlag(FLAGS_sim_tflops);
  const double mem = absl::GetFlag(FLAGS_sim_mem_efficiency);
  const double compute = absl::GetFlag(FLAGS_sim_compute_efficiency);
  const double overhead = absl::GetFlag(FLAGS_sim_step_overhead_us);
  if (device != Device::kSim) {
    for (const char* flag : {"sim_gpu", "sim_hbm_gbps", "sim_tflops", "sim_mem_efficiency",
                             "sim_compute_efficiency", "sim_step_overhead_us"}) {
      if (FlagChanged(flag))
        return absl::InvalidArgumentError("the --sim-* flags need --device sim");
    }
    return GpuProfile();
  }
  ASSIGN_OR_RETURN(GpuProfile gpu, GpuPreset(absl::GetFlag(FLAGS_sim_gpu)));
  if (hbm < 0 || tflops < 0 || overhead < 0 || !(mem > 0 && mem <= 1) ||
      !(compute > 0 && compute <= 1)) {
    return absl::InvalidArgumentError(
        "--sim-hbm-gbps, --sim-tflops and --sim-step-overhead-us must be >= 0, "
        "--sim-mem-efficiency and --sim-compute-efficiency in (0, 1]");
  }
  if (hbm > 0) gpu.hbm_bytes_per_s = hbm * 1e9;
  if (tflops > 0) gpu.dense_flops = tflops * 1e12;
  gpu.mem_efficiency = mem;
  gpu.compute_efficiency = compute;
  gpu.step_overhead_s = overhead * 1e-6;
  return gpu;
}

}  // namespace

absl::StatusOr<BackendConfig> BackendConfigFromFlags() {
  BackendConfig b;
  ASSIGN_OR_RETURN(b.device, ParseDevice(absl::GetFlag(FLAGS_device)));
  b.cpu_threads = absl::GetFlag(FLAGS_cpu_threads);
  b.gpu_memory_utilization = absl::GetFlag(FLAGS_gpu_memory_utilization);
  ASSIGN_OR_RETURN(b.attention_kernel, ParseAttentionKernel(absl::GetFlag(FLAGS_attention_kernel)));
  b.cuda_graph_max_batch =
      absl::GetFlag(FLAGS_enforce_eager) ? 0 : absl::GetFlag(FLAGS_cuda_graph_max_batch);
  b.decode_gemv_max_batch = absl::GetFlag(FLAGS_decode_gemv_max_batch);
  ASSIGN_OR_RETURN(b.sim_gpu, SimGpuFromFlags(b.device));
  return b;
}

absl::StatusOr<SchedulerConfig> SchedulerConfigFromFlags() {
  SchedulerConfig s;
  s.max_num_seqs = absl::GetFlag(FLAGS_max_num_seqs);
  s.max_num_batched_tokens = absl::GetFlag(FLAGS_max_num_batched_tokens);
  s.long_prefill_token_threshold = absl::GetFlag(FLAGS_long_prefill_token_threshold);
  s.max_num_partial_prefills = absl::GetFlag(FLAGS_max_num_partial_prefills);
  s.max_long_partial_prefills = absl::GetFlag(FLAGS_max_long_partial_prefills);
  ASSIGN_OR_RETURN(s.preemption_mode, ParsePreemptionMode(absl::GetFlag(FLAGS_preemption_mode)));
  if (!absl::GetFlag(FLAGS_enable_chunked_prefill)) {
    return absl::InvalidArgumentError(
        "--no-enable-chunked-prefill: kvserve always prefills prompts in chunks of "
        "--max-num-batched-tokens, beside running decodes; to prefill a prompt in one step, set "
        "--max-num-batched-tokens to at least --max-model-len");
  }
  return s;
}

// vLLM's --scheduling-policy, --async-scheduling and --seed.
absl::Status PolicyFromFlags(EngineConfig& c) {
  const std::string policy = absl::GetFlag(FLAGS_scheduling_policy);
  if (policy != "fcfs" && policy != "priority") {
    return absl::InvalidArgumentError(
        absl::StrCat("--scheduling-policy '", policy, "' is not one of fcfs, priority"));
  }
  c.priority_scheduling = policy == "priority";
  c.async_scheduling =
      absl::GetFlag(FLAGS_async_scheduling) ? AsyncScheduling::kAuto : AsyncScheduling::kOff;
  c.jump_forward = absl::GetFlag(FLAGS_jump_forward);
  const std::string seed = absl::GetFlag(FLAGS_seed);
  if (!seed.empty()) {
    uint64_t value;
    if (!absl::SimpleAtoi(seed, &value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--seed '", seed, "' is not a non-negative integer"));
    }
    c.seed = value;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<EngineConfig> EngineConfigFromFlags() {
  EngineConfig c;
  c.model_dir = absl::GetFlag(FLAGS_model);
  if (c.model_dir.empty()) return absl::InvalidArgumentError("--model DIR is required");
  c.config_path = absl::GetFlag(FLAGS_hf_config);
  c.model_id = absl::GetFlag(FLAGS_served_model_name);
  c.max_model_len = absl::GetFlag(FLAGS_max_model_len);
  ASSIGN_OR_RETURN(c.dtype, ParseWeightDtype(absl::GetFlag(FLAGS_dtype)));
  ASSIGN_OR_RETURN(c.cache, CacheConfigFromFlags());
  ASSIGN_OR_RETURN(c.backend, BackendConfigFromFlags());
  c.parallel.tensor_parallel_size = absl::GetFlag(FLAGS_tensor_parallel_size);
  c.parallel.collective_timeout = absl::Seconds(absl::GetFlag(FLAGS_tp_timeout_seconds));
  ASSIGN_OR_RETURN(c.scheduler, SchedulerConfigFromFlags());
  RETURN_IF_ERROR(PolicyFromFlags(c));
  return c;
}

absl::Status TakePositionalModel(const std::vector<char*>& positional) {
  if (positional.size() <= 1) return absl::OkStatus();
  if (positional.size() > 2) {
    return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", positional[2],
                                                   "': give the model once, as MODEL or --model"));
  }
  const std::string model = positional[1], flag = absl::GetFlag(FLAGS_model);
  if (!flag.empty() && flag != model) {
    return absl::InvalidArgumentError(
        absl::StrCat("the model is given twice: '", model, "' and --model '", flag, "'"));
  }
  absl::SetFlag(&FLAGS_model, model);
  return absl::OkStatus();
}

absl::StatusOr<RunnerTestHooks> TestHooksFromFlags() {
  RunnerTestHooks hooks;
  const std::string fault = absl::GetFlag(FLAGS_tp_fault_injection);
  if (fault.empty()) return hooks;
  RankFault& f = hooks.rank_fault;
  std::vector<std::string> parts = absl::StrSplit(fault, ':');
  if (parts.size() != 3 || !absl::SimpleAtoi(parts[0], &f.rank) ||
      !absl::SimpleAtoi(parts[1], &f.step) || (parts[2] != "error" && parts[2] != "stall")) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tp-fault-injection '", fault, "' is not RANK:STEP:error|stall"));
  }
  f.stall = parts[2] == "stall";
  return hooks;
}

}  // namespace kvserve::worker
