#include "worker/model_runner.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/model/model_weights.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "kernels/cpu/gloo_communicator.h"
#include "worker/model/decode_graphs.h"
#ifdef KVSERVE_WITH_CUDA
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/nccl_communicator.h"
#endif

namespace kvserve::worker {
namespace {

std::string Mib(double bytes) { return absl::StrFormat("%.1f", bytes / 1048576.0); }

// Rank r's weights must fit in what its GPU has free: a clear error up front, not a failed
// cudaMalloc halfway through loading. The need is a lower bound (every tensor but the
// embedding split evenly over the ranks), so a model that fits is never refused.
absl::Status CheckWeightsFit(const RunnerConfig& c, kernels::Backend& backend, int r, int ranks) {
  size_t free = 0, total = 0;
  if (!backend.MemoryInfo(&free, &total)) return absl::OkStatus();
  double need = 0;
  for (const WeightSpec& w : ExpectedWeights(c.model)) {
    double n = 1;
    for (int64_t d : w.shape) n *= static_cast<double>(d);
    const double bytes = n * (w.shape.size() == 2 ? DTypeSize(c.weight_type) : sizeof(float));
    need += w.name == "model.embed_tokens.weight" ? bytes : bytes / ranks;
  }
  if (need <= static_cast<double>(free)) return absl::OkStatus();
  return absl::ResourceExhaustedError(
      absl::StrCat("the weights need at least ", Mib(need), " MiB on each GPU as ",
                   std::string(DTypeName(c.weight_type)), ", but GPU ", r, " has ",
                   Mib(static_cast<double>(free)), " of ", Mib(static_cast<double>(total)),
                   " MiB free (use more tensor-parallel ranks",
                   c.weight_type == DType::kF32 ? ", or --dtype bfloat16)" : ")"));
}

// An explicit --num-blocks must fit next to the weights and step buffers.
absl::Status CheckPoolFits(const RunnerConfig& c, kernels::Backend& backend, int r, int kv_heads,
                           int num_blocks) {
  size_t free = 0, total = 0;
  if (!backend.MemoryInfo(&free, &total)) return absl::OkStatus();
  const double need =
      static_cast<double>(num_blocks) *
      static_cast<double>(c.kv_spec.BytesPerBlock(kv_heads, c.block_size, c.model.head_dim));
  if (need <= static_cast<double>(free)) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "--num-blocks ", num_blocks, " needs ", Mib(need), " MiB of KV cache on each GPU, but GPU ",
      r, " has ", Mib(static_cast<double>(free)), " of ", Mib(static_cast<double>(total)),
      " MiB free after loading the weights (lower --num-blocks, or leave it out to size the pool "
      "by --gpu-memory-utilization)"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<ModelRunner>> ModelRunner::Create(const RunnerConfig& config,
                                                                 const RunnerTestHooks& hooks) {
  const int n = config.parallel.tensor_parallel_size;
  RETURN_IF_ERROR(Model::CheckShardable(config.model, n));
#ifndef KVSERVE_WITH_CUDA
  if (config.backend.device == Device::kCuda) {
    return absl::FailedPreconditionError(
        "--device cuda: this build has no CUDA backend (configure with KVSERVE_CUDA=ON)");
  }
#endif
  RETURN_IF_ERROR(CheckDevices(config.backend, config.parallel));
  std::unique_ptr<ModelRunner> runner(new ModelRunner());
  runner->config_ = config;
  runner->hooks_ = hooks;
  runner->ranks_.resize(n);
  if (config.backend.device == Device::kSim) {
    // As the GPU would hold them: 16-bit weights, and a KV cache whose auto dtype is 16-bit
    // (the modelless devices plan the CPU's float32 pools for auto).
    const KvCacheSpec& spec = config.kv_spec;
    double kv =
        spec.BytesPerToken(config.model.num_kv_heads, config.block_size, config.model.head_dim);
    if (!spec.k.empty() && spec.k[0].bits() == 32) kv /= 2;
    runner->sim_kv_bytes_per_token_ = kv;
    runner->sim_model_ = SimModelOf(config.model, /*weight_bytes=*/2, kv);
  }
  RETURN_IF_ERROR(runner->ConnectRanks());
  for (int r = 0; r < n; ++r) RETURN_IF_ERROR(runner->LoadRank(r));
  RETURN_IF_ERROR(runner->AllocatePools());
  {
    absl::MutexLock lock(&runner->mu_);
    runner->done_.assign(n, 0);
    runner->status_.assign(n, absl::OkStatus());
  }
  for (int r = 1; r < n; ++r) {
    runner->workers_.emplace_back([p = runner.get(), r] { p->WorkerLoop(r); });
  }
  return runner;
}

absl::Status ModelRunner::ConnectRanks() {
  const int n = size();
  if (n == 1) return absl::OkStatus();
  const absl::Duration timeout = config_.parallel.collective_timeout;
  std::vector<std::unique_ptr<kernels::Communicator>> comms;
#ifdef KVSERVE_WITH_CUDA
  if (config_.backend.device == Device::kCuda) {
    std::vector<int> devices(n);
    for (int r = 0; r < n; ++r) devices[r] = r;
    ASSIGN_OR_RETURN(comms, kernels::CreateNcclGroup(devices, timeout));
  }
#endif
  if (config_.backend.device == Device::kCpu) {
    ASSIGN_OR_RETURN(comms, kernels::CreateGlooGroup(n, timeout));
  }
  for (int r = 0; r < n; ++r) ranks_[r].comm = std::move(comms[r]);
  return absl::OkStatus();
}

absl::Status ModelRunner::LoadRank(int r) {
  const RunnerConfig& config = config_;
  const bool cuda = config.backend.device == Device::kCuda;
  Rank& rank = ranks_[r];
#ifdef KVSERVE_WITH_CUDA
  if (cuda) {
    RETURN_IF_ERROR(
        kernels::CheckCudaKvSupport(config.kv_spec, config.model.head_dim, config.block_size, r));
    const AttentionKernel kernel = config.backend.attention_kernel;
    ASSIGN_OR_RETURN(
        rank.backend,
        kernels::CreateCudaBackend({.device = r,
                                    .attention_tensor_cores = kernel != AttentionKernel::kSimt,
                                    .attention_pipelined = kernel == AttentionKernel::kPipelined,
                                    .decode_gemv_max_rows = config.backend.decode_gemv_max_batch}));
  }
#endif
  if (!cuda) {
    rank.backend = hooks_.make_backend
                       ? hooks_.make_backend()
                       : kernels::CreateCpuBackend({.num_threads = config.backend.cpu_threads});
  }
  if (IsModelless(config.backend.device)) return absl::OkStatus();  // no weights
  if (cuda) RETURN_IF_ERROR(CheckWeightsFit(config, *rank.backend, r, size()));
  ASSIGN_OR_RETURN(rank.model,
                   Model::Load(config.model_dir, config.model, rank.backend.get(),
                               {.shard = TpShard{r, size()},
                                .comm = rank.comm.get(),
                                .weight_type = config.weight_type,
                                .graph_max_batch = config.backend.cuda_graph_max_batch,
                                .graph_max_blocks_per_seq = config.max_blocks_per_seq}));
  rank.model->ReserveScratch(config.max_step_tokens, config.max_logit_rows,
                             2 * config.max_logit_rows,
                             int64_t{config.max_blocks_per_seq} * config.block_size);
  return absl::OkStatus();
}

absl::Status ModelRunner::AllocatePools() {
  const RunnerConfig& config = config_;
  const bool cuda = config.backend.device == Device::kCuda;
  const int kv_heads = Model::LocalKvHeads(config.model, size());
  num_blocks_ = config.num_blocks;
  if (num_blocks_ == 0) {
    if (!cuda) return absl::InvalidArgumentError("the CPU backend needs a KV pool size in blocks");
    ASSIGN_OR_RETURN(num_blocks_, BlocksThatFit());
  } else if (cuda) {
    for (int r = 0; r < size(); ++r) {
      RETURN_IF_ERROR(CheckPoolFits(config, *ranks_[r].backend, r, kv_heads, num_blocks_));
    }
  }
  // The modelless devices never read or write the KV cache: its blocks are bookkeeping only, so
  // a null or sim worker can stand for a GPU's pool of any size.
  if (IsModelless(config.backend.device)) return absl::OkStatus();
  for (Rank& rank : ranks_) {
    rank.device =
        std::make_unique<KvStorage>(config.kv_spec, num_blocks_, kv_heads, config.block_size,
                                    config.model.head_dim, rank.backend.get());
    if (config.num_host_blocks > 0) {
      rank.host = std::make_unique<KvStorage>(config.kv_spec, config.num_host_blocks, kv_heads,
                                              config.block_size, config.model.head_dim,
                                              rank.backend.get(), /*host_tier=*/true);
    }
  }
  return absl::OkStatus();
}

absl::Status ModelRunner::CheckDevices(const BackendConfig& backend,
                                       const ParallelConfig& parallel) {
#ifdef KVSERVE_WITH_CUDA
  const int ranks = parallel.tensor_parallel_size;
  if (backend.device == Device::kCuda && ranks > kernels::CudaDeviceCount()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--tensor-parallel-size ", ranks, " puts rank r on GPU r, but this machine has ",
        kernels::CudaDeviceCount(), " CUDA device(s)"));
  }
#endif
  return absl::OkStatus();
}

absl::StatusOr<int> ModelRunner::BlocksThatFit() const {
  const RunnerConfig& c = config_;
  const int kv_heads = Model::LocalKvHeads(c.model, size());
  const int64_t block_bytes = c.kv_spec.BytesPerBlock(kv_heads, c.block_size, c.model.head_dim);
  // cuBLAS workspaces and allocator slack, not yet allocated when memory is measured.
  constexpr double kHeadroom = 256.0 * 1048576.0;
  int64_t blocks = int64_t{1} << 30;
  for (int r = 0; r < size(); ++r) {
    size_t free = 0, total = 0;
    if (!ranks_[r].backend->MemoryInfo(&free, &total)) {
      return absl::FailedPreconditionError("the backend cannot report its memory");
    }
    const double used = static_cast<double>(total - free);
    const double budget =
        c.backend.gpu_memory_utilization * static_cast<double>(total) - used - kHeadroom;
    const auto fit = static_cast<int64_t>(budget / static_cast<double>(block_bytes));
    LOG(INFO) << "GPU " << r << ": " << total / 1048576 << " MiB, " << used / 1048576.0
              << " MiB in use after loading (weights, step buffers, CUDA context): " << fit
              << " KV blocks of " << block_bytes << " bytes fit in --gpu-memory-utilization "
              << c.backend.gpu_memory_utilization;
    if (fit < 1) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "--gpu-memory-utilization ", c.backend.gpu_memory_utilization,
          " leaves no room for the KV cache on GPU ", r, ": ",
          static_cast<int64_t>(used / 1048576.0), " MiB of ", total / 1048576,
          " MiB are in use after loading the weights and the step buffers (raise it, lower "
          "--max-num-batched-tokens, or use more tensor-parallel ranks)"));
    }
    blocks = std::min(blocks, fit);
  }
  return static_cast<int>(blocks);
}

ModelRunner::~ModelRunner() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.SignalAll();
  for (std::thread& t : workers_) t.join();
}

std::string_view ModelRunner::communicator() const {
  return ranks_[0].comm ? ranks_[0].comm->name() : std::string_view("none");
}

absl::StatusOr<ForwardOutput> ModelRunner::RunRank(int r, const BlockCopies& copies,
                                                   const ForwardBatch& batch, int64_t step) {
  const RankFault& fault = hooks_.rank_fault;
  if (fault.rank == r && fault.step == step - warmup_steps_) {
    if (!fault.stall) return absl::InternalError("injected fault");
    std::this_thread::sleep_for(std::chrono::milliseconds(
        2 * absl::ToInt64Milliseconds(config_.parallel.collective_timeout)));
  }
  Rank& rank = ranks_[r];
  if (IsModelless(config_.backend.device)) {
    ForwardOutput out = NullForward(batch);
    if (config_.backend.device == Device::kSim) out.sim_seconds = SimulateStep(copies, batch);
    return out;
  }
  if (!copies.empty()) {
    std::vector<kernels::KvCacheView> device = rank.device->Views();
    std::vector<kernels::KvCacheView> host = rank.host ? rank.host->Views() : device;
    auto run = [&](const std::vector<kernels::KvCacheView>& src,
                   const std::vector<kernels::KvCacheView>& dst,
                   const std::vector<std::pair<int, int>>& pairs) {
      if (pairs.empty()) return;
      std::vector<int32_t> from, to;
      for (auto [a, b] : pairs) {
        from.push_back(a);
        to.push_back(b);
      }
      rank.backend->CopyBlocks({src.data(), dst.data(), static_cast<int64_t>(src.size()),
                                from.data(), to.data(), static_cast<int64_t>(from.size())});
    };
    // Device blocks leave before anything overwrites them; host blocks are read before reuse.
    run(device, host, copies.device_to_host);
    run(device, device, copies.device_to_device);
    run(host, device, copies.host_to_device);
  }
  if (batch.token_ids.empty()) return ForwardOutput();
  return rank.model->Forward(batch, *rank.device);
}

ForwardOutput ModelRunner::NullForward(const ForwardBatch& batch) const {
  const std::vector<int>& eos = config_.model.eos_token_ids;
  int32_t token = 0;
  while (std::find(eos.begin(), eos.end(), token) != eos.end()) ++token;
  ForwardOutput out;
  out.tokens.assign(batch.samples.size(), token);
  out.logprobs.resize(batch.logprobs.size());
  for (TokenLogprobs& lp : out.logprobs) lp.token = token;
  out.logits.assign(batch.host_logit_rows.size() * static_cast<size_t>(config_.model.vocab_size),
                    0.0f);
  return out;
}

double ModelRunner::SimulateStep(const BlockCopies& copies, const ForwardBatch& batch) const {
  const auto start = std::chrono::steady_clock::now();
  const int64_t blocks =
      static_cast<int64_t>(copies.device_to_host.size() + copies.host_to_device.size());
  const StepCost cost = EstimateStep(
      sim_model_, config_.backend.sim_gpu,
      {.query_len = batch.query_len,
       .context_len = batch.context_len,
       .logit_rows = static_cast<int64_t>(batch.logit_rows.size()),
       .copy_bytes = blocks * static_cast<int64_t>(sim_kv_bytes_per_token_ * config_.block_size)});
  if (config_.backend.sim_sleep) {
    std::this_thread::sleep_until(start + std::chrono::duration<double>(cost.seconds));
  }
  return cost.seconds;
}

void ModelRunner::WorkerLoop(int r) {
  int64_t seen = 0;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      while (!stop_ && step_ <= seen) cv_.Wait(&mu_);
      if (stop_) return;
      seen = step_;
    }
    // copies_ and batch_ change only in Execute, which waits for this rank (or has failed and
    // never publishes again).
    absl::Status s = RunRank(r, copies_, batch_, seen).status();
    {
      absl::MutexLock lock(&mu_);
      status_[r] = s;
      done_[r] = seen;
    }
    cv_.SignalAll();
    if (!s.ok()) return;  // a failed rank leaves the group; its peers time out
  }
}

absl::StatusOr<int> ModelRunner::RecordDecodeGraphs() {
  const std::vector<DecodeGraphs::Bucket> buckets =
      DecodeGraphs::Buckets(config_.backend.cuda_graph_max_batch, config_.max_blocks_per_seq);
  if (config_.backend.cuda_graph_max_batch <= 0 || buckets.size() > DecodeGraphs::kMaxGraphs)
    return 0;
  warmup_steps_ = static_cast<int64_t>(buckets.size());  // before any: RankFault skips them
  int64_t first_step;
  {
    absl::MutexLock lock(&mu_);
    first_step = step_;
  }
  int recorded = 0;
  for (const auto& [seqs, width] : buckets) {
    // Placeholder rows: token 0 at position 0, no KV slot, attending to one cached token of
    // block 0 (whatever it holds); their logits are drawn from by nothing.
    ForwardBatch b;
    b.token_ids.assign(seqs, 0);
    b.positions.assign(seqs, 0);
    b.slot_mapping.assign(seqs, -1);
    b.query_len.assign(seqs, 1);
    b.context_len.assign(seqs, 1);
    b.block_tables.assign(seqs * width, 0);
    b.max_blocks_per_seq = static_cast<int>(width);
    for (int32_t s = 0; s < seqs; ++s) {
      b.query_start.push_back(s);
      b.logit_rows.push_back(s);
    }
    ASSIGN_OR_RETURN(ForwardOutput out, Execute({}, b));
    recorded += out.recorded_graph ? 1 : 0;
    // Out of device memory for graphs on every rank: the rest run eagerly. (A rank that stops
    // alone leaves its peers recording: eager on one rank and replayed on another, a step's
    // collectives are the same.)
    bool all_stopped = true;
    for (const Rank& rank : ranks_) all_stopped = all_stopped && !rank.model->graphs_stopped().ok();
    if (all_stopped) break;
  }
  absl::MutexLock lock(&mu_);
  warmup_steps_ = step_ - first_step;
  return recorded;
}

absl::Status ModelRunner::graphs_stopped() const {
  for (int r = 0; r < size(); ++r) {
    if (absl::Status s = ranks_[r].model->graphs_stopped(); !s.ok()) {
      return size() == 1 ? s : Annotate(s, absl::StrCat("tensor-parallel rank ", r));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ForwardOutput> ModelRunner::Execute(const BlockCopies& copies,
                                                   const ForwardBatch& batch) {
  if (!failed_.ok()) return failed_;
  const int n = size();
  int64_t step;
  {
    absl::MutexLock lock(&mu_);
    if (n > 1) {  // the other ranks read the step's plan from here
      copies_ = copies;
      batch_ = batch;
    }
    step = ++step_;
  }
  if (n > 1) cv_.SignalAll();
  absl::StatusOr<ForwardOutput> out =
      n > 1 ? RunRank(0, copies_, batch_, step) : RunRank(0, copies, batch, step);
  absl::Status first = out.status();
  if (!first.ok()) first = Annotate(first, "tensor-parallel rank 0");
  // Wait for the other ranks, bounded: a stalled rank has already made our collectives fail.
  const absl::Time deadline =
      absl::Now() + 2 * config_.parallel.collective_timeout + absl::Seconds(1);
  {
    absl::MutexLock lock(&mu_);
    for (int r = 1; r < n; ++r) {
      while (done_[r] < step) {
        if (cv_.WaitWithDeadline(&mu_, deadline)) break;  // timed out
      }
      const bool finished = done_[r] >= step;
      absl::Status s =
          finished ? status_[r] : absl::DeadlineExceededError("did not finish the step in time");
      if (!s.ok() && (first.ok() || absl::IsDeadlineExceeded(first))) {
        first = Annotate(s, absl::StrCat("tensor-parallel rank ", r));
      }
    }
  }
  if (!first.ok()) {
    failed_ = first;
    LOG(ERROR) << "model runner failed: " << first;
    return first;
  }
  return out;
}

void ModelRunner::Collect(const ForwardBatch& batch, ForwardOutput& out) {
  if (!out.in_flight) return;
  ranks_[0].model->Collect(batch, out);
}

}  // namespace kvserve::worker
