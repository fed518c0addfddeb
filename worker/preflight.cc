#include "worker/preflight.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "worker/model/decode_graphs.h"
#include "worker/model/model.h"

namespace kvserve::worker {
namespace {

constexpr double kGiB = 1073741824.0;

std::string Mib(int64_t bytes) { return absl::StrFormat("%.1f MiB", bytes / 1048576.0); }

std::string WeightTypeName(DType t) {
  return t == DType::kBF16 ? "bfloat16" : t == DType::kF16 ? "float16" : "float32";
}

int BlocksIn(double gib, int64_t block_bytes) {
  return static_cast<int>(std::min<double>(gib * kGiB / static_cast<double>(block_bytes), 1 << 30));
}

// Like vLLM: a host tier beyond 70% of the machine's memory would take the host down with it
// (the CPU backend's allocation, or a CUDA pinned allocation, fails or the OOM killer comes).
absl::Status CheckHostTierFits(const PoolPlan& p, int ranks) {
  const double host_tier = static_cast<double>(p.host_blocks) * p.block_bytes * ranks;
  const double memory = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
  if (memory <= 0 || host_tier <= 0.7 * memory) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat(
      "--swap-space: a host tier of %.1f GiB (%d blocks of %d bytes on each of %d ranks) is more "
      "than 70%% of this machine's %.1f GiB of memory",
      host_tier / kGiB, p.host_blocks, p.block_bytes, ranks, memory / kGiB));
}

// Bytes of memory this process may still take: the kernel's MemAvailable, and under a cgroup
// v2 limit (a container's) what is left of it. 0 when neither can be read.
double AvailableMemory() {
  double available = 0;
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  double kib = 0;
  while (meminfo >> key >> kib) {
    if (key == "MemAvailable:") available = kib * 1024;
    meminfo.ignore(1 << 10, '\n');
  }
  std::ifstream max_file("/sys/fs/cgroup/memory.max"),
      current_file("/sys/fs/cgroup/memory.current");
  std::string max;
  double current = 0;
  if (max_file >> max && max != "max" && current_file >> current) {
    const double left = std::max(0.0, std::stod(max) - current);
    available = available > 0 ? std::min(available, left) : left;
  }
  return available;
}

// The pools the CPU holds (the device pool on the CPU backend, the host tier on any) are
// committed when they are made: they must fit in the memory available now, or the worker
// would be killed later, under traffic, instead of refused here.
absl::Status CheckPoolsFitInMemory(const EngineConfig& config, const PoolPlan& p, int ranks) {
  if (IsModelless(config.backend.device)) return absl::OkStatus();  // no pool is allocated
  const bool cpu = config.backend.device != Device::kCuda;
  const double pools =
      (static_cast<double>(cpu ? p.device_blocks : 0) + p.host_blocks) * p.block_bytes * ranks;
  const double available = AvailableMemory();
  if (available <= 0 || pools <= available) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat(
      "the KV pools need %.1f GiB of host memory (%s%d host blocks, %d bytes each, on %d ranks) "
      "and %.1f GiB is available (MemAvailable, or the cgroup's memory.max): lower %s",
      pools / kGiB, cpu ? absl::StrCat(p.device_blocks, " CPU blocks and ") : "", p.host_blocks,
      p.block_bytes, ranks, available / kGiB,
      cpu ? "--kv-cache-memory-gib / --num-blocks or --swap-space" : "--swap-space"));
}

std::string GraphsLine(const GraphRecording& g, bool sized_by_gpu) {
  if (g.max_batch <= 0) return "";
  std::string line = absl::StrFormat(
      "\n  CUDA graphs         decode batches of up to %d, %d buckets: ", g.max_batch, g.buckets);
  if (g.buckets > static_cast<int>(DecodeGraphs::kMaxGraphs)) {
    absl::StrAppend(&line, "recorded on first use (too many to record all at start-up)");
    return line;
  }
  absl::StrAppendFormat(&line, "%d recorded at start-up in %.2f s, %.1f MiB on GPU 0", g.recorded,
                        g.seconds, g.device_mib);
  if (!g.stopped.empty()) {
    absl::StrAppend(&line, "; recording stopped, the rest run eagerly: ", g.stopped, " (lower ",
                    sized_by_gpu ? "--gpu-memory-utilization" : "the KV pool's size",
                    " or --cuda-graph-max-batch)");
  }
  return line;
}

}  // namespace

absl::StatusOr<PoolPlan> PlanPools(const EngineConfig& config, const KvCacheSpec& kv_spec,
                                   const ModelConfig& model) {
  const CacheConfig& c = config.cache;
  const int ranks = config.parallel.tensor_parallel_size;
  PoolPlan p;
  p.block_bytes =
      kv_spec.BytesPerBlock(Model::LocalKvHeads(model, ranks), c.block_size, model.head_dim);
  if (c.num_blocks > 0) {
    p.device_blocks = c.num_blocks;
  } else if (c.kv_cache_memory_bytes > 0) {
    p.device_blocks = static_cast<int>(std::min<int64_t>(
        INT32_MAX, c.kv_cache_memory_bytes / static_cast<int64_t>(p.block_bytes)));
    if (p.device_blocks < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--kv-cache-memory-bytes (", c.kv_cache_memory_bytes, ") holds no block of ",
                       p.block_bytes, " bytes"));
    }
  } else if (config.backend.device != Device::kCuda) {
    p.device_blocks = BlocksIn(c.kv_cache_memory_gib, p.block_bytes);
    if (p.device_blocks < 1) {
      return absl::InvalidArgumentError(absl::StrCat("--kv-cache-memory-gib (",
                                                     c.kv_cache_memory_gib, ") holds no block of ",
                                                     p.block_bytes, " bytes"));
    }
  }
  p.host_blocks = c.num_host_blocks;
  if (p.host_blocks == 0 && c.swap_space_gib > 0) {
    p.host_blocks = BlocksIn(c.swap_space_gib, p.block_bytes);
  }
  RETURN_IF_ERROR(CheckHostTierFits(p, ranks));
  RETURN_IF_ERROR(CheckPoolsFitInMemory(config, p, ranks));
  if (c.host_prefix_cache && p.host_blocks == 0) {
    return absl::InvalidArgumentError("--host-prefix-cache needs a host tier: set --swap-space");
  }
  if (config.scheduler.preemption_mode == PreemptionMode::kSwap && p.host_blocks == 0) {
    return absl::InvalidArgumentError("--preemption-mode swap needs a host tier: set --swap-space");
  }
  return p;
}

absl::Status CheckPoolHoldsLongestSequence(const EngineConfig& config, const PoolPlan& pools,
                                           int num_blocks, int max_model_len) {
  const int block_size = config.cache.block_size;
  const int64_t pool_tokens = int64_t{num_blocks} * block_size;
  if (max_model_len <= pool_tokens) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "--max-model-len (", max_model_len, ") is larger than the KV pool can hold (", pool_tokens,
      " tokens in ", num_blocks, " blocks of ", block_size, "); ",
      pools.sized_by_gpu()
          ? "lower it or raise --gpu-memory-utilization"
          : "lower it or give the pool more memory (--kv-cache-memory-gib / --num-blocks)"));
}

absl::StatusOr<GraphRecording> RecordDecodeGraphs(ModelRunner& runner,
                                                  const RunnerConfig& runner_config) {
  GraphRecording g;
  g.max_batch = runner_config.backend.cuda_graph_max_batch;
  if (g.max_batch <= 0) return g;
  g.buckets =
      static_cast<int>(DecodeGraphs::Buckets(g.max_batch, runner_config.max_blocks_per_seq).size());
  size_t free_before = 0, free_after = 0, total = 0;
  runner.backend(0).MemoryInfo(&free_before, &total);
  const absl::Time start = absl::Now();
  ASSIGN_OR_RETURN(g.recorded, runner.RecordDecodeGraphs());
  g.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  runner.backend(0).MemoryInfo(&free_after, &total);
  g.device_mib = (static_cast<double>(free_before) - static_cast<double>(free_after)) / 1048576.0;
  if (const absl::Status s = runner.graphs_stopped(); !s.ok()) g.stopped = std::string(s.message());
  return g;
}

std::string PreflightReport(const PreflightFacts& f) {
  const ModelConfig& c = f.model;
  const EngineConfig& config = f.config;
  const int bs = config.cache.block_size;
  const int tp = config.parallel.tensor_parallel_size;
  const int rank_kv_heads = Model::LocalKvHeads(c, tp);
  const int64_t blocks_per_seq = (f.max_model_len + bs - 1) / bs;
  const KvFormat& k0 = f.kv_spec.k[c.num_layers / 2];
  const KvFormat& v0 = f.kv_spec.v[c.num_layers / 2];
  const KvStorage* host = f.runner.host_kv(0);
  const bool swap =
      f.pools.host_blocks > 0 && config.scheduler.preemption_mode != PreemptionMode::kRecompute;
  return absl::StrFormat(
      "kvserve preflight: model %s (%s, %d layers, %d heads, %d KV heads x %d head_dim)\n"
      "  tensor parallel     %d rank(s) (%s), %d KV head(s) per rank%s\n"
      "  weights             %s per rank (%s)\n"
      "  KV cache            K %s, V %s (layers: %s)\n"
      "  KV bytes per token  %.2f per rank (%d per block of %d tokens, data and scales)\n"
      "  KV pool             %d blocks x %d tokens = %d tokens, %s per rank\n"
      "  host tier           %d blocks, %s (swap %s, host prefix cache %s)\n"
      "  max concurrency     %d sequences at --max-model-len=%d (%d blocks each)\n"
      "  scheduler           --max-num-seqs=%d --max-num-batched-tokens=%d, prefix caching %s%s",
      config.model_id, c.model_type, c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, tp,
      f.runner.communicator(), rank_kv_heads,
      c.num_kv_heads < tp ? " (replicated: fewer KV heads than ranks)" : "",
      Mib(f.runner.weight_bytes(0)), WeightTypeName(f.weight_type), k0.Describe(), v0.Describe(),
      f.kv_spec.CacheKeyQuant(), f.kv_spec.BytesPerToken(rank_kv_heads, bs, c.head_dim),
      f.pools.block_bytes, bs, f.num_blocks, bs, int64_t{f.num_blocks} * bs,
      Mib(f.runner.has_kv_pools() ? f.runner.device_kv(0).bytes()
                                  : int64_t{f.num_blocks} * f.pools.block_bytes),
      f.pools.host_blocks,
      Mib(host != nullptr ? host->bytes() : int64_t{f.pools.host_blocks} * f.pools.block_bytes),
      swap ? "on" : "off", config.cache.host_prefix_cache ? "on" : "off",
      f.num_blocks / blocks_per_seq, f.max_model_len, blocks_per_seq, config.scheduler.max_num_seqs,
      config.scheduler.max_num_batched_tokens, config.cache.enable_prefix_caching ? "on" : "off",
      GraphsLine(f.graphs, f.pools.sized_by_gpu()));
}

}  // namespace kvserve::worker
