#include "worker/engine_config.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/string_util.h"
#include "worker/model/model.h"

namespace kvserve::worker {
namespace {

absl::Status Unknown(std::string_view flag, std::string_view value, std::string_view choices) {
  return absl::InvalidArgumentError(
      absl::StrCat(Sv(flag), " '", Sv(value), "' is not one of ", Sv(choices)));
}

absl::Status AtLeast(std::string_view flag, int64_t value, int64_t least) {
  if (value >= least) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(Sv(flag), " must be >= ", least, ", got ", value));
}

absl::Status ValidateScheduler(const SchedulerConfig& s) {
  RETURN_IF_ERROR(AtLeast("--max-num-seqs", s.max_num_seqs, 1));
  RETURN_IF_ERROR(AtLeast("--max-num-batched-tokens", s.max_num_batched_tokens, 1));
  RETURN_IF_ERROR(AtLeast("--long-prefill-token-threshold", s.long_prefill_token_threshold, 0));
  RETURN_IF_ERROR(AtLeast("--max-num-partial-prefills", s.max_num_partial_prefills, 0));
  return AtLeast("--max-long-partial-prefills", s.max_long_partial_prefills, 1);
}

absl::Status ValidateCache(const CacheConfig& c) {
  if (c.block_size != 8 && c.block_size != 16 && c.block_size != 32) {
    return absl::InvalidArgumentError(
        absl::StrCat("--block-size must be 8, 16 or 32, got ", c.block_size));
  }
  RETURN_IF_ERROR(AtLeast("--num-blocks", c.num_blocks, 0));
  if (!(c.swap_space_gib >= 0) || c.num_host_blocks < 0) {
    return absl::InvalidArgumentError("--swap-space must be >= 0");
  }
  return absl::OkStatus();
}

absl::Status ValidateBackend(const BackendConfig& b) {
  const bool cuda = b.device == Device::kCuda;
  if (!(b.gpu_memory_utilization > 0 && b.gpu_memory_utilization <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--gpu-memory-utilization must be in (0, 1], got ", b.gpu_memory_utilization));
  }
  if (b.attention_kernel != AttentionKernel::kSimt && !cuda) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--attention-kernel ",
        b.attention_kernel == AttentionKernel::kTensorCores ? "tensor-cores" : "pipelined",
        " needs --device cuda"));
  }
  RETURN_IF_ERROR(AtLeast("--cuda-graph-max-batch", b.cuda_graph_max_batch, 0));
  if (b.cuda_graph_max_batch > 0 && !cuda) {
    return absl::InvalidArgumentError("--cuda-graph-max-batch needs --device cuda");
  }
  RETURN_IF_ERROR(AtLeast("--decode-gemv-max-batch", b.decode_gemv_max_batch, 0));
  if (b.decode_gemv_max_batch > 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("--decode-gemv-max-batch must be at most 8, got ", b.decode_gemv_max_batch));
  }
  if (b.decode_gemv_max_batch > 0 && !cuda) {
    return absl::InvalidArgumentError("--decode-gemv-max-batch needs --device cuda");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Device> ParseDevice(std::string_view name) {
  if (name == "cpu") return Device::kCpu;
  if (name == "cuda") return Device::kCuda;
  if (name == "null") return Device::kNull;
  if (name == "sim") return Device::kSim;
  return Unknown("--device", name, "cpu, cuda, null, sim");
}

absl::StatusOr<WeightDtype> ParseWeightDtype(std::string_view name) {
  if (name == "auto") return WeightDtype::kAuto;
  if (name == "float32" || name == "float") return WeightDtype::kFloat32;
  if (name == "bfloat16") return WeightDtype::kBFloat16;
  if (name == "float16" || name == "half") return WeightDtype::kFloat16;
  return Unknown("--dtype", name, "auto, float32, bfloat16, float16");
}

absl::StatusOr<AttentionKernel> ParseAttentionKernel(std::string_view name) {
  if (name == "simt") return AttentionKernel::kSimt;
  if (name == "tensor-cores") return AttentionKernel::kTensorCores;
  if (name == "pipelined") return AttentionKernel::kPipelined;
  return Unknown("--attention-kernel", name, "simt, tensor-cores, pipelined");
}

std::string_view DeviceName(Device device) {
  switch (device) {
    case Device::kCuda:
      return "cuda";
    case Device::kNull:
      return "null";
    case Device::kSim:
      return "sim";
    default:
      return "cpu";
  }
}

absl::Status EngineConfig::Validate() const {
  if (model_dir.empty()) return absl::InvalidArgumentError("--model DIR is required");
  RETURN_IF_ERROR(AtLeast("--max-model-len", max_model_len, 0));
  RETURN_IF_ERROR(ValidateCache(cache));
  RETURN_IF_ERROR(ValidateBackend(backend));
  RETURN_IF_ERROR(AtLeast("--tensor-parallel-size", parallel.tensor_parallel_size, 1));
  if (IsModelless(backend.device) && parallel.tensor_parallel_size != 1) {
    return absl::InvalidArgumentError(absl::StrCat("--device ", Sv(DeviceName(backend.device)),
                                                   " runs one rank: --tensor-parallel-size 1"));
  }
  if (backend.decode_gemv_max_batch > 0 && dtype == WeightDtype::kFloat32) {
    return absl::InvalidArgumentError(
        "--decode-gemv-max-batch needs 16-bit weights (--dtype bfloat16, float16 or auto), not "
        "--dtype float32");
  }
  if (parallel.collective_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--tp-timeout-seconds must be > 0");
  }
  if (async_scheduling == AsyncScheduling::kOn && parallel.tensor_parallel_size != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("async scheduling runs with one tensor-parallel rank, not ",
                     parallel.tensor_parallel_size, " (--async-scheduling=false)"));
  }
  return ValidateScheduler(scheduler);
}

absl::Status EngineConfig::ValidateForModel(const ModelConfig& model) const {
  if (model.sliding_window > 0) {
    return absl::InvalidArgumentError(absl::StrCat(ConfigPath(), ": sliding-window attention (",
                                                   model.sliding_window, ") is not supported yet"));
  }
  if (max_model_len > model.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max-model-len (", max_model_len, ") exceeds the model's max_position_embeddings (",
        model.max_position_embeddings, ")"));
  }
  return Model::CheckShardable(model, parallel.tensor_parallel_size);
}

DType EngineConfig::WeightType(const ModelConfig& model) const {
  switch (dtype) {
    case WeightDtype::kFloat32:
      return DType::kF32;
    case WeightDtype::kBFloat16:
      return DType::kBF16;
    case WeightDtype::kFloat16:
      return DType::kF16;
    case WeightDtype::kAuto:
      break;
  }
  if (backend.device != Device::kCuda) return DType::kF32;  // the CPU backend computes in f32
  return model.dtype == "float16" ? DType::kF16 : DType::kBF16;
}

std::string EngineConfig::ConfigPath() const {
  return config_path.empty() ? model_dir + "/config.json" : config_path;
}

}  // namespace kvserve::worker
