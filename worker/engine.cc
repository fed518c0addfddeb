#include "worker/engine.h"

#include <unistd.h>

#include <filesystem>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "nlohmann/json.hpp"
#include "worker/model/decode_graphs.h"
#include "worker/sampler.h"
#ifdef KVSERVE_WITH_CUDA
#include "kernels/cuda/nccl_communicator.h"
#endif

namespace kvserve::worker {
namespace {

std::string Mib(int64_t bytes) { return absl::StrFormat("%.1f MiB", bytes / 1048576.0); }

// EOS ids from generation_config.json (an int or a list), which may list more than config.json.
std::vector<int> GenerationEos(const std::string& dir) {
  std::vector<int> out;
  absl::StatusOr<std::string> text = ReadFileToString(dir + "/generation_config.json");
  if (!text.ok()) return out;
  nlohmann::json j = nlohmann::json::parse(*text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("eos_token_id")) return out;
  const nlohmann::json& e = j["eos_token_id"];
  if (e.is_number_integer()) out.push_back(e.get<int>());
  if (e.is_array()) {
    for (const auto& v : e) {
      if (v.is_number_integer()) out.push_back(v.get<int>());
    }
  }
  return out;
}

// --dtype: the weights' type on `device` for a checkpoint declaring `checkpoint` (may be "").
absl::StatusOr<DType> WeightType(const std::string& dtype, const std::string& device,
                                 const std::string& checkpoint) {
  if (dtype == "float32" || dtype == "float") return DType::kF32;
  if (dtype == "bfloat16") return DType::kBF16;
  if (dtype == "float16" || dtype == "half") return DType::kF16;
  if (dtype != "auto") {
    return absl::InvalidArgumentError(
        absl::StrCat("--dtype '", dtype, "' is not one of auto, float32, bfloat16, float16"));
  }
  if (device != "cuda") return DType::kF32;  // the CPU backend computes in float32
  return checkpoint == "float16" ? DType::kF16 : DType::kBF16;
}

std::string WeightTypeName(DType t) {
  return t == DType::kBF16 ? "bfloat16" : t == DType::kF16 ? "float16" : "float32";
}

}  // namespace

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const EngineConfig& config) {
  std::unique_ptr<Engine> e(new Engine());
  e->config_ = config;
  if (config.block_size != 8 && config.block_size != 16 && config.block_size != 32) {
    return absl::InvalidArgumentError(
        absl::StrCat("--block-size must be 8, 16 or 32, got ", config.block_size));
  }
  if (config.scheduler.max_num_seqs < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-num-seqs must be >= 1, got ", config.scheduler.max_num_seqs));
  }
  if (config.scheduler.max_num_batched_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--max-num-batched-tokens must be >= 1, got ",
                                                   config.scheduler.max_num_batched_tokens));
  }
  if (config.scheduler.long_prefill_token_threshold < 0 ||
      config.scheduler.max_num_partial_prefills < 0 ||
      config.scheduler.max_long_partial_prefills < 1) {
    return absl::InvalidArgumentError(
        "--long-prefill-token-threshold and --max-num-partial-prefills must be >= 0 and "
        "--max-long-partial-prefills >= 1");
  }
  if (config.attention_kernel != "simt" && config.attention_kernel != "tensor-cores") {
    return absl::InvalidArgumentError(absl::StrCat("--attention-kernel '", config.attention_kernel,
                                                   "' is not one of simt, tensor-cores"));
  }
  if (config.attention_kernel == "tensor-cores" && config.device != "cuda") {
    return absl::InvalidArgumentError("--attention-kernel tensor-cores needs --device cuda");
  }
  if (config.cuda_graph_max_batch < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--cuda-graph-max-batch must be >= 0, got ", config.cuda_graph_max_batch));
  }
  if (config.cuda_graph_max_batch > 0 && config.device != "cuda") {
    return absl::InvalidArgumentError("--cuda-graph-max-batch needs --device cuda");
  }
  const std::string config_path =
      config.config_path.empty() ? config.model_dir + "/config.json" : config.config_path;
  ASSIGN_OR_RETURN(ModelConfig model_config, LoadHfConfig(config_path));
  if (model_config.sliding_window > 0) {
    return absl::InvalidArgumentError(absl::StrCat(config_path, ": sliding-window attention (",
                                                   model_config.sliding_window,
                                                   ") is not supported yet"));
  }
  e->model_config_ = model_config;
#ifdef KVSERVE_WITH_CUDA
  if (config.device == "cuda" && config.tensor_parallel_size > kernels::CudaDeviceCount()) {
    return absl::FailedPreconditionError(
        absl::StrCat("--tensor-parallel-size ", config.tensor_parallel_size,
                     " puts rank r on GPU r, but this machine has ", kernels::CudaDeviceCount(),
                     " CUDA device(s)"));
  }
#endif
  RETURN_IF_ERROR(Model::CheckShardable(model_config, config.tensor_parallel_size));

  const int64_t max_pos = model_config.max_position_embeddings;
  e->max_model_len_ = config.max_model_len > 0 ? config.max_model_len : static_cast<int>(max_pos);
  if (e->max_model_len_ > max_pos) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-model-len (", e->max_model_len_,
                     ") exceeds the model's max_position_embeddings (", max_pos, ")"));
  }
  ASSIGN_OR_RETURN(const DType weight_type,
                   WeightType(config.dtype, config.device, model_config.dtype));
  // The cache's "auto" type (and that of full-precision layers) is the weights' type.
  const KvDType auto_kv = weight_type == DType::kBF16  ? KvDType::kBf16
                          : weight_type == DType::kF16 ? KvDType::kFp16
                                                       : KvDType::kFp32;
  ASSIGN_OR_RETURN(e->kv_spec_, MakeKvCacheSpec(config.kv_quant, model_config.num_layers,
                                                model_config.head_dim, auto_kv));
  const int tp = config.tensor_parallel_size;
  const int rank_kv_heads = Model::LocalKvHeads(model_config, tp);
  // The pools are sized per rank: each rank stores only its KV heads.
  const int64_t block_bytes =
      e->kv_spec_.BytesPerBlock(rank_kv_heads, config.block_size, model_config.head_dim);
  const bool size_from_gpu = config.device == "cuda" && config.num_blocks <= 0;
  if (!(config.gpu_memory_utilization > 0 && config.gpu_memory_utilization <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--gpu-memory-utilization must be in (0, 1], got ", config.gpu_memory_utilization));
  }
  if (config.num_blocks > 0) {
    e->num_blocks_ = config.num_blocks;
  } else if (size_from_gpu) {
    e->num_blocks_ = 0;  // the runner measures what fits once the weights are loaded
  } else {
    const double pool = config.kv_cache_memory_gib * 1073741824.0;
    e->num_blocks_ = static_cast<int>(std::min<double>(pool / block_bytes, 1 << 30));
    if (e->num_blocks_ < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--kv-cache-memory-gib (", config.kv_cache_memory_gib,
                       ") holds no block of ", block_bytes, " bytes"));
    }
  }
  int host_blocks = config.num_host_blocks;
  if (host_blocks == 0 && config.swap_space_gib > 0) {
    host_blocks = static_cast<int>(
        std::min<double>(config.swap_space_gib * 1073741824.0 / block_bytes, 1 << 30));
  }
  if (config.swap_space_gib < 0 || host_blocks < 0) {
    return absl::InvalidArgumentError("--swap-space must be >= 0");
  }
  // Like vLLM: a host tier beyond 70% of the machine's memory would take the host down with it
  // (the CPU backend's allocation, or a CUDA pinned allocation, fails or the OOM killer comes).
  const double host_tier = static_cast<double>(host_blocks) * block_bytes * tp;
  const double memory = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
  if (memory > 0 && host_tier > 0.7 * memory) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--swap-space: a host tier of %.1f GiB (%d blocks of %d bytes on each of %d ranks) is more "
        "than 70%% of this machine's %.1f GiB of memory",
        host_tier / 1073741824.0, host_blocks, block_bytes, tp, memory / 1073741824.0));
  }
  if (config.host_prefix_cache && host_blocks == 0) {
    return absl::InvalidArgumentError("--host-prefix-cache needs a host tier: set --swap-space");
  }
  if (config.scheduler.preemption_mode == PreemptionMode::kSwap && host_blocks == 0) {
    return absl::InvalidArgumentError("--preemption-mode swap needs a host tier: set --swap-space");
  }
  RunnerConfig rc;
  rc.weight_type = weight_type;
  rc.model_dir = config.model_dir;
  rc.model = model_config;
  rc.kv_spec = e->kv_spec_;
  rc.num_blocks = e->num_blocks_;
  rc.gpu_memory_utilization = config.gpu_memory_utilization;
  rc.max_step_tokens = config.scheduler.max_num_batched_tokens;
  rc.max_logit_rows = config.scheduler.max_num_seqs;
  rc.num_host_blocks = host_blocks;
  rc.block_size = config.block_size;
  rc.tensor_parallel_size = tp;
  rc.cpu_threads = config.cpu_threads;
  rc.device = config.device;
  rc.attention_tensor_cores = config.attention_kernel == "tensor-cores";
  rc.cuda_graph_max_batch = std::min({config.cuda_graph_max_batch, config.scheduler.max_num_seqs,
                                      config.scheduler.max_num_batched_tokens});
  rc.max_blocks_per_seq = (e->max_model_len_ + config.block_size - 1) / config.block_size;
  rc.collective_timeout = config.tp_timeout;
  rc.fault = config.tp_fault;
  rc.make_backend = config.make_backend;
  ASSIGN_OR_RETURN(e->runner_, ModelRunner::Create(rc));
  e->num_blocks_ = e->runner_->num_blocks();
  const int64_t pool_tokens = int64_t{e->num_blocks_} * config.block_size;
  if (e->max_model_len_ > pool_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max-model-len (", e->max_model_len_, ") is larger than the KV pool can hold (",
        pool_tokens, " tokens in ", e->num_blocks_, " blocks of ", config.block_size, "); ",
        size_from_gpu ? "lower it or raise --gpu-memory-utilization"
                      : "lower it or give the pool more memory (--kv-cache-memory-gib / "
                        "--num-blocks)"));
  }
  std::string graphs;
  if (rc.cuda_graph_max_batch > 0) {
    GraphRecording& g = e->graph_recording_;
    g.buckets = static_cast<int>(
        DecodeGraphs::Buckets(rc.cuda_graph_max_batch, rc.max_blocks_per_seq).size());
    size_t free_before = 0, free_after = 0, total = 0;
    e->runner_->backend(0).MemoryInfo(&free_before, &total);
    const absl::Time start = absl::Now();
    ASSIGN_OR_RETURN(g.recorded, e->runner_->RecordDecodeGraphs());
    g.seconds = absl::ToDoubleSeconds(absl::Now() - start);
    e->runner_->backend(0).MemoryInfo(&free_after, &total);
    g.device_mib = (static_cast<double>(free_before) - static_cast<double>(free_after)) / 1048576.0;
    if (const absl::Status s = e->runner_->graphs_stopped(); !s.ok()) {
      g.stopped = std::string(s.message());
    }
    graphs = absl::StrFormat("\n  CUDA graphs         decode batches of up to %d, %d buckets: ",
                             rc.cuda_graph_max_batch, g.buckets);
    if (g.buckets > static_cast<int>(DecodeGraphs::kMaxGraphs)) {
      absl::StrAppend(&graphs, "recorded on first use (too many to record all at start-up)");
    } else {
      absl::StrAppendFormat(&graphs, "%d recorded at start-up in %.2f s, %.1f MiB on GPU 0",
                            g.recorded, g.seconds, g.device_mib);
      if (!g.stopped.empty()) {
        absl::StrAppend(&graphs, "; recording stopped, the rest run eagerly: ", g.stopped,
                        " (lower ",
                        size_from_gpu ? "--gpu-memory-utilization" : "the KV pool's size",
                        " or --cuda-graph-max-batch)");
      }
    }
  }
  e->kv_ = std::make_unique<KvCacheManager>(KvPoolOptions{e->num_blocks_, config.block_size,
                                                          config.enable_prefix_caching, host_blocks,
                                                          config.host_prefix_cache});
  SchedulerConfig scheduler = config.scheduler;
  scheduler.max_logit_rows = rc.max_logit_rows;  // the rows the model reserved
  e->scheduler_ = std::make_unique<Scheduler>(scheduler, e->kv_.get());
  e->eos_ids_ = model_config.eos_token_ids;
  for (int id : GenerationEos(config.model_dir)) {
    if (std::find(e->eos_ids_.begin(), e->eos_ids_.end(), id) == e->eos_ids_.end()) {
      e->eos_ids_.push_back(id);
    }
  }
  if (e->config_.model_id.empty()) {
    e->config_.model_id = std::filesystem::path(config.model_dir).filename().string();
  }

  const ModelConfig& c = model_config;
  const int64_t blocks_per_seq = (e->max_model_len_ + config.block_size - 1) / config.block_size;
  const KvFormat& k0 = e->kv_spec_.k[c.num_layers / 2];
  const KvFormat& v0 = e->kv_spec_.v[c.num_layers / 2];
  e->preflight_ = absl::StrFormat(
      "kvserve preflight: model %s (%s, %d layers, %d heads, %d KV heads x %d head_dim)\n"
      "  tensor parallel     %d rank(s) (%s), %d KV head(s) per rank%s\n"
      "  weights             %s per rank (%s)\n"
      "  KV cache            K %s, V %s (layers: %s)\n"
      "  KV bytes per token  %.2f per rank (%d per block of %d tokens, data and scales)\n"
      "  KV pool             %d blocks x %d tokens = %d tokens, %s per rank\n"
      "  host tier           %d blocks, %s (swap %s, host prefix cache %s)\n"
      "  max concurrency     %d sequences at --max-model-len=%d (%d blocks each)\n"
      "  scheduler           --max-num-seqs=%d --max-num-batched-tokens=%d, prefix caching %s%s",
      e->config_.model_id, c.model_type, c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, tp,
      e->runner_->communicator(), rank_kv_heads,
      c.num_kv_heads < tp ? " (replicated: fewer KV heads than ranks)" : "",
      Mib(e->runner_->weight_bytes(0)), WeightTypeName(weight_type), k0.Describe(), v0.Describe(),
      e->kv_spec_.CacheKeyQuant(),
      e->kv_spec_.BytesPerToken(rank_kv_heads, config.block_size, c.head_dim), block_bytes,
      config.block_size, e->num_blocks_, config.block_size, pool_tokens,
      Mib(e->runner_->device_kv(0).bytes()), host_blocks,
      Mib(e->runner_->host_kv(0) ? e->runner_->host_kv(0)->bytes() : 0),
      host_blocks > 0 && config.scheduler.preemption_mode != PreemptionMode::kRecompute ? "on"
                                                                                        : "off",
      config.host_prefix_cache ? "on" : "off", e->num_blocks_ / blocks_per_seq, e->max_model_len_,
      blocks_per_seq, config.scheduler.max_num_seqs, config.scheduler.max_num_batched_tokens,
      config.enable_prefix_caching ? "on" : "off", graphs);
  return e;
}

absl::Status Engine::Validate(const RequestInput& in) const {
  if (in.request_id.empty()) return absl::InvalidArgumentError("request_id must not be empty");
  if (requests_.contains(in.request_id)) {
    return absl::AlreadyExistsError(
        absl::StrCat("request '", in.request_id, "' is already running"));
  }
  if (in.prompt.empty()) return absl::InvalidArgumentError("the prompt must not be empty");
  const int vocab = model_config_.vocab_size;
  for (size_t i = 0; i < in.prompt.size(); ++i) {
    if (in.prompt[i] < 0 || in.prompt[i] >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat("prompt token ", i, " is ", in.prompt[i],
                                                     ", outside the vocabulary [0, ", vocab, ")"));
    }
  }
  if (in.max_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat("max_tokens must be >= 1, got ", in.max_tokens));
  }
  if (static_cast<int64_t>(in.prompt.size()) + in.max_tokens > max_model_len_) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt (", in.prompt.size(), " tokens) + max_tokens (", in.max_tokens,
                     ") exceeds the maximum model length (", max_model_len_, ")"));
  }
  const SamplingParams& s = in.sampling;
  if (!(s.temperature >= 0.0f)) return absl::InvalidArgumentError("temperature must be >= 0");
  if (!(s.top_p > 0.0f && s.top_p <= 1.0f))
    return absl::InvalidArgumentError("top_p must be in (0, 1]");
  if (!(s.min_p >= 0.0f && s.min_p <= 1.0f))
    return absl::InvalidArgumentError("min_p must be in [0, 1]");
  if (s.top_k < -1) return absl::InvalidArgumentError("top_k must be -1, 0 or positive");
  if (s.n < 1 || s.n > config_.scheduler.max_num_seqs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "n must be in [1, --max-num-seqs=", config_.scheduler.max_num_seqs, "], got ", s.n));
  }
  if (s.logprobs && (*s.logprobs < 0 || *s.logprobs > 20)) {
    return absl::InvalidArgumentError("logprobs must be in [0, 20]");
  }
  for (int32_t t : in.stop_token_ids) {
    if (t < 0 || t >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("stop token id ", t, " is outside the vocabulary"));
    }
  }
  return absl::OkStatus();
}

absl::Status Engine::AddRequest(RequestInput input) {
  RETURN_IF_ERROR(Validate(input));
  auto req = std::make_unique<Request>();
  CacheKey key{config_.model_id,
               kv_spec_.CacheKeyDType(),
               kv_spec_.CacheKeyQuant(),
               static_cast<uint32_t>(config_.block_size),
               static_cast<uint32_t>(config_.tensor_parallel_size),
               input.cache_salt};
  ASSIGN_OR_RETURN(req->extra_key, key.Serialize());
  req->input = std::move(input);
  req->arrival = next_arrival_++;
  if (req->input.sampling.top_k == -1) req->input.sampling.top_k = 0;
  uint64_t seed = req->input.sampling.seed ? *req->input.sampling.seed : std::random_device{}();
  auto seq = std::make_unique<Sequence>();
  seq->id = next_seq_id_++;
  seq->request = req.get();
  seq->tokens = req->input.prompt;
  seq->num_prompt_tokens = static_cast<int>(seq->tokens.size());
  seq->rng_seed = static_cast<int64_t>(seed);
  UpdateHashes(*seq);
  scheduler_->Add(seq.get());
  req->sequences.push_back(std::move(seq));
  const std::string id = req->input.request_id;
  requests_.emplace(id, std::move(req));
  return absl::OkStatus();
}

absl::Status Engine::Abort(const std::string& request_id) {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) {
    return absl::NotFoundError(absl::StrCat("no request '", request_id, "' in flight"));
  }
  for (auto& seq : it->second->sequences) {
    if (seq->status != SeqStatus::kFinished) scheduler_->Remove(seq.get());
  }
  requests_.erase(it);
  return absl::OkStatus();
}

void Engine::UpdateHashes(Sequence& seq) {
  const int bs = config_.block_size;
  while (static_cast<int>(seq.block_hashes.size() + 1) * bs <= seq.num_tokens()) {
    const size_t i = seq.block_hashes.size();
    std::vector<uint32_t> block(seq.tokens.begin() + i * bs, seq.tokens.begin() + (i + 1) * bs);
    seq.block_hashes.push_back(
        HashBlock(i == 0 ? nullptr : &seq.block_hashes.back(), block, seq.request->extra_key));
  }
}

void Engine::AppendToken(Sequence& seq, int32_t token, const TokenLogprobs* logprobs) {
  const RequestInput& in = seq.request->input;
  seq.tokens.push_back(token);
  ++counters_.generated_tokens;
  if (logprobs != nullptr) seq.logprobs.push_back(*logprobs);
  UpdateHashes(seq);
  if (std::find(in.stop_token_ids.begin(), in.stop_token_ids.end(), token) !=
          in.stop_token_ids.end() ||
      (!in.sampling.ignore_eos &&
       std::find(eos_ids_.begin(), eos_ids_.end(), token) != eos_ids_.end())) {
    seq.finish_reason = FinishReason::kStop;
    seq.stop_token = token;
  } else if (seq.num_output_tokens() >= in.max_tokens || seq.num_tokens() >= max_model_len_) {
    seq.finish_reason = FinishReason::kLength;
  }
}

void Engine::Fork(Request& req, absl::Span<const int32_t> tokens, const TokenLogprobs* logprobs) {
  Sequence& first = *req.sequences[0];
  for (int i = 1; i < req.input.sampling.n; ++i) {
    auto child = std::make_unique<Sequence>();
    child->id = next_seq_id_++;
    child->request = &req;
    child->sample_index = i;
    child->tokens = first.tokens;
    child->num_prompt_tokens = first.num_prompt_tokens;
    child->block_hashes = first.block_hashes;
    child->rng_seed = first.rng_seed + i;
    kv_->Fork(first, *child);
    scheduler_->AddRunning(child.get());
    req.sequences.push_back(std::move(child));
  }
  req.forked = true;
  for (size_t i = 0; i < req.sequences.size(); ++i) {
    AppendToken(*req.sequences[i], tokens[i], logprobs == nullptr ? nullptr : logprobs + i);
  }
}

absl::StatusOr<std::vector<SequenceOutput>> Engine::Step() {
  Scheduler::Output plan = scheduler_->Schedule();
  std::vector<SequenceOutput> outs;
  const BlockCopies copies = kv_->TakeCopies();
  counters_.cow_copies += static_cast<int64_t>(copies.device_to_device.size());
  if (plan.scheduled.empty()) {
    // Nothing to run, but preemptions may have planned swap-outs: move the data now.
    if (!copies.empty()) {
      absl::Status s = runner_->Execute(copies, ForwardBatch{}).status();
      kv_->FinishCopies();
      RETURN_IF_ERROR(s);
    }
    return outs;
  }
  ++counters_.steps;

  ForwardBatch batch;
  int max_blocks = 1;
  for (const auto& s : plan.scheduled) {
    max_blocks = std::max<int>(max_blocks, static_cast<int>(s.seq->block_table.size()));
  }
  batch.max_blocks_per_seq = max_blocks;
  struct RowUse {
    Sequence* seq;
    int position;          // token position whose logits this row holds
    int host_row = -1;     // its index in the output's logits (prompt logits)
    int first_sample = 0;  // its draws: output tokens [first_sample, first_sample + num_samples)
    int num_samples = 0;
    int first_logprobs = -1;  // the draws' logprobs from here in the output's, when asked for
  };
  std::vector<RowUse> rows;
  for (const auto& [seq, n] : plan.scheduled) {
    const int start = seq->num_computed_tokens;
    batch.query_start.push_back(static_cast<int32_t>(batch.token_ids.size()));
    batch.query_len.push_back(n);
    batch.context_len.push_back(start + n);
    const bool prompt_logits = seq->request->input.return_prompt_logits && seq->sample_index == 0;
    for (int i = 0; i < n; ++i) {
      const int pos = start + i;
      const int row = static_cast<int>(batch.token_ids.size());
      batch.token_ids.push_back(seq->tokens[pos]);
      batch.positions.push_back(pos);
      batch.slot_mapping.push_back(int64_t{seq->block_table[pos / config_.block_size]} *
                                       config_.block_size +
                                   pos % config_.block_size);
      const bool last = pos + 1 == seq->num_tokens();
      const bool prompt_row = prompt_logits && pos < seq->num_prompt_tokens;
      if (!last && !prompt_row) continue;
      const Request& req = *seq->request;
      RowUse use{seq, pos};
      const auto logit_row = static_cast<int32_t>(batch.logit_rows.size());
      batch.logit_rows.push_back(row);
      if (prompt_row) {
        use.host_row = static_cast<int>(batch.host_logit_rows.size());
        batch.host_logit_rows.push_back(logit_row);
      }
      if (last) {
        // A request's first token is drawn for each of its n samples (seeds rng_seed + i).
        const bool fork = !req.forked && req.input.sampling.n > 1;
        use.first_sample = static_cast<int>(batch.samples.size());
        use.num_samples = fork ? req.input.sampling.n : 1;
        if (req.input.sampling.logprobs)
          use.first_logprobs = static_cast<int>(batch.logprobs.size());
        for (int i = 0; i < use.num_samples; ++i) {
          if (req.input.sampling.logprobs) {
            batch.logprobs.push_back({logit_row, static_cast<int32_t>(batch.samples.size()),
                                      *req.input.sampling.logprobs});
          }
          batch.samples.push_back(MakeSampleRequest(req.input.sampling, seq->rng_seed + i,
                                                    fork ? 0 : seq->num_output_tokens(),
                                                    logit_row));
        }
      }
      rows.push_back(use);
    }
    for (int i = 0; i < max_blocks; ++i) {
      batch.block_tables.push_back(
          i < static_cast<int>(seq->block_table.size()) ? seq->block_table[i] : 0);
    }
  }
  absl::StatusOr<ForwardOutput> run = runner_->Execute(copies, batch);
  kv_->FinishCopies();
  if (!run.ok()) return run.status();
  const ForwardOutput& out = *run;
  const int vocab = model_config_.vocab_size;
  counters_.graph_steps += out.graph ? 1 : 0;

  for (const auto& [seq, n] : plan.scheduled) {
    const int start = seq->num_computed_tokens;
    counters_.computed_tokens += n;
    counters_.computed_prompt_tokens +=
        std::max(0, std::min(start + n, seq->num_prompt_tokens) - start);
    seq->num_computed_tokens += n;
    kv_->CacheComputedBlocks(*seq);
  }
  for (const RowUse& use : rows) {
    Sequence& seq = *use.seq;
    Request& req = *seq.request;
    absl::Span<const float> row;
    if (use.host_row >= 0) row = {out.logits.data() + int64_t{use.host_row} * vocab, size_t(vocab)};
    if (req.input.return_prompt_logits && seq.sample_index == 0 &&
        use.position < seq.num_prompt_tokens) {
      req.prompt_logits.resize(static_cast<size_t>(seq.num_prompt_tokens) * vocab);
      std::copy(row.begin(), row.end(), req.prompt_logits.begin() + int64_t{use.position} * vocab);
    }
    if (use.num_samples == 0) continue;
    absl::Span<const int32_t> tokens(out.tokens.data() + use.first_sample, use.num_samples);
    const TokenLogprobs* logprobs =
        use.first_logprobs >= 0 ? out.logprobs.data() + use.first_logprobs : nullptr;
    if (use.num_samples > 1) {
      Fork(req, tokens, logprobs);
    } else {
      req.forked = true;
      AppendToken(seq, tokens[0], logprobs);
    }
  }

  // Report new tokens, finish sequences, and retire finished requests.
  std::vector<std::string> done;
  for (auto& [id, req] : requests_) {
    bool all_finished = req->forked;
    bool any_output = false;
    for (auto& seq : req->sequences) {
      if (seq->status == SeqStatus::kFinished) continue;
      const bool finishing = seq->finish_reason != FinishReason::kNone;
      if (seq->tokens.size() - seq->num_prompt_tokens > seq->num_emitted || finishing) {
        SequenceOutput o;
        o.request_id = id;
        o.sample_index = seq->sample_index;
        o.new_tokens.assign(seq->tokens.begin() + seq->num_prompt_tokens + seq->num_emitted,
                            seq->tokens.end());
        if (!seq->logprobs.empty()) {
          o.new_logprobs.assign(seq->logprobs.begin() + seq->num_emitted, seq->logprobs.end());
        }
        seq->num_emitted = seq->tokens.size() - seq->num_prompt_tokens;
        o.finish_reason = seq->finish_reason;
        o.stop_token = seq->stop_token;
        o.num_prompt_tokens = seq->num_prompt_tokens;
        o.num_cached_prompt_tokens = std::max(0, req->num_cached_prompt_tokens);
        outs.push_back(std::move(o));
        any_output = true;
      }
      if (finishing) {
        scheduler_->Remove(seq.get());
        seq->status = SeqStatus::kFinished;
      } else {
        all_finished = false;
      }
    }
    if (all_finished && any_output) {
      outs.back().request_finished = true;
      outs.back().prompt_logits = std::move(req->prompt_logits);
      done.push_back(id);
    }
  }
  for (const std::string& id : done) requests_.erase(id);
  return outs;
}

EngineStats Engine::stats() const {
  EngineStats s = counters_;
  const Scheduler::Counters& c = scheduler_->counters();
  s.prefix_queried_tokens = c.prefix_queried_tokens;
  s.prefix_hit_tokens = c.prefix_hit_tokens;
  s.preemptions = c.preemptions;
  s.swap_preemptions = c.swap_preemptions;
  s.recompute_preemptions = c.recompute_preemptions;
  const KvCacheCounters& k = kv_->counters();
  const int64_t block_bytes =
      kv_spec_.BytesPerBlock(Model::LocalKvHeads(model_config_, config_.tensor_parallel_size),
                             config_.block_size, model_config_.head_dim);
  s.kv_bytes_per_block = block_bytes;
  s.prefix_hit_tokens_device = k.device_hit_blocks * config_.block_size;
  s.prefix_hit_tokens_host = k.host_hit_blocks * config_.block_size;
  s.swap_out_blocks = k.swap_out_blocks;
  s.swap_in_blocks = k.swap_in_blocks;
  s.swap_out_bytes = k.swap_out_blocks * block_bytes;
  s.swap_in_bytes = k.swap_in_blocks * block_bytes;
  s.host_spilled_blocks = k.host_spilled_blocks;
  if (const BlockPool* host = kv_->host_pool()) {
    s.host_blocks_total = host->num_blocks();
    s.host_blocks_free = host->num_free();
    s.host_blocks_cached_evictable = host->num_cached_evictable();
  }
  s.evictions = kv_->pool().num_evictions();
  s.num_running = scheduler_->num_running();
  s.num_waiting = scheduler_->num_waiting();
  s.num_swapped = scheduler_->num_swapped();
  s.num_requests = static_cast<int>(requests_.size());
  s.blocks_total = kv_->pool().num_blocks();
  s.blocks_free = kv_->pool().num_free();
  s.blocks_cached_evictable = kv_->pool().num_cached_evictable();
  return s;
}

Engine::KvUsage Engine::kv_usage() const {
  KvUsage u;
  absl::flat_hash_map<int, int> filled;  // device block -> tokens in it
  for (const auto& [id, req] : requests_) {
    for (const auto& seq : req->sequences) {
      if (seq->status != SeqStatus::kRunning) continue;
      for (size_t i = 0; i < seq->block_table.size(); ++i) {
        const int tokens =
            std::clamp<int>(seq->num_computed_tokens - static_cast<int>(i) * config_.block_size, 0,
                            config_.block_size);
        int& f = filled[seq->block_table[i]];
        f = std::max(f, tokens);
      }
    }
  }
  u.allocated_slots = static_cast<int64_t>(filled.size()) * config_.block_size;
  for (const auto& [block, tokens] : filled) u.used_tokens += tokens;
  return u;
}

void Engine::ForEachCachedBlock(const std::function<void(const BlockHash&, Medium)>& fn) const {
  kv_->pool().ForEachCached([&](const BlockHash& h) { fn(h, Medium::kDevice); });
  if (const BlockPool* host = kv_->host_pool()) {
    host->ForEachCached([&](const BlockHash& h) { fn(h, Medium::kHost); });
  }
}

std::vector<std::string> Engine::AbortAll() {
  std::vector<std::string> ids;
  for (const auto& [id, req] : requests_) ids.push_back(id);
  for (const std::string& id : ids) Abort(id).IgnoreError();
  return ids;
}

bool Engine::Started(const std::string& request_id) const {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return true;
  return it->second->sequences[0]->status != SeqStatus::kWaiting ||
         it->second->sequences[0]->num_computed_tokens > 0;
}

absl::Status Engine::CheckInvariants() const {
  std::vector<const Sequence*> live;
  for (const auto& [id, req] : requests_) {
    for (const auto& seq : req->sequences) {
      if (seq->status != SeqStatus::kFinished) live.push_back(seq.get());
      if (seq->status == SeqStatus::kWaiting && !seq->block_table.empty()) {
        return absl::InternalError(absl::StrCat("waiting seq ", seq->id, " holds blocks"));
      }
    }
  }
  if (static_cast<int>(live.size()) !=
      scheduler_->num_running() + scheduler_->num_waiting() + scheduler_->num_swapped()) {
    return absl::InternalError("scheduler queues and live sequences disagree");
  }
  return kv_->CheckInvariants(live);
}

}  // namespace kvserve::worker
