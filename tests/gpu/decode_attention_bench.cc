// Decode paged attention on the GPU: time, achieved bandwidth and its fraction of the
// device-to-device copy bandwidth measured in the same run, for bf16 / fp8 / int8 / int4
// caches (per-token scales) at batch 1/16/64/256 × context 1K/4K/16K/64K, 32 query / 8 KV
// heads, head_dim 128, block 16; plus block sizes 8 and 32 at 16 × 4K and 64 × 4K (bf16), and
// prefill chunks (query tokens over a cached prefix; bf16 and int8) timed alone.
// Prints a table, a row as soon as it is measured; --json FILE holds the rows measured so far
// (rewritten after each), so a run cut short by a timeout still reports what it timed.
// Sequences get shuffled, non-contiguous blocks as a paged cache would.
//
// --tensor-cores times the tensor-core kernel (paged_attention_mma.cu) instead of the SIMT one;
// --prefetch-k times it with each step's K loaded during the step before; --pipelined times the
// pipelined decode kernel (paged_attention_pipelined.cu; the prefill rows on tensor cores).
//
//   decode_attention_bench [--json FILE] [--quick] [--tensor-cores | --prefetch-k | --pipelined]
//                          [--only FORMAT:BATCH:CONTEXT]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "common/kv/kv_format.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/device/cuda_check.h"

namespace kvserve::kernels {
namespace {

// Fills `bytes` of device memory with `pattern` (host, `pattern_bytes` long) repeated.
void FillRepeated(void* dst, size_t bytes, const std::vector<uint8_t>& pattern) {
  auto* d = static_cast<uint8_t*>(dst);
  const size_t first = std::min(bytes, pattern.size());
  KVSERVE_CUDA_CHECK(cudaMemcpy(d, pattern.data(), first, cudaMemcpyHostToDevice));
  for (size_t done = first; done < bytes;) {  // doubling device-to-device copies
    const size_t n = std::min(done, bytes - done);
    KVSERVE_CUDA_CHECK(cudaMemcpy(d + done, d, n, cudaMemcpyDeviceToDevice));
    done += n;
  }
  KVSERVE_CUDA_CHECK(cudaDeviceSynchronize());  // the backend's streams do not wait for this one
}

struct Row {
  std::string format;
  int batch, context, block_size, blocks_per_sm;
  double us, gbps, fraction;
  int query = 1;  // query tokens per sequence (prefill rows: more than 1)
};

constexpr int kMaxPrefillTokens = 2048;

void PrintRow(const Row& r) {
  std::printf("%-6s %6d %6d %7d %5d %6d %11.1f %9.0f %7.1f%%\n", r.format.c_str(), r.batch, r.query,
              r.context, r.block_size, r.blocks_per_sm, r.us, r.gbps, 100 * r.fraction);
  std::fflush(stdout);
}

// Replaces `path` with the rows so far (written aside, then renamed: never half a file).
bool WriteJson(const char* path, double copy_gbps, bool tensor_cores, bool prefetch_k,
               bool pipelined, const std::vector<Row>& rows) {
  const std::string partial = std::string(path) + ".partial";
  FILE* f = std::fopen(partial.c_str(), "w");
  if (f == nullptr) {
    std::perror(partial.c_str());
    return false;
  }
  std::fprintf(f,
               "{\"copy_gbps\": %.1f, \"tensor_cores\": %s, \"prefetch_k\": %s, "
               "\"pipelined\": %s, \"rows\": [\n",
               copy_gbps, tensor_cores ? "true" : "false", prefetch_k ? "true" : "false",
               pipelined ? "true" : "false");
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    std::fprintf(f,
                 "  {\"format\": \"%s\", \"batch\": %d, \"context\": %d, \"block_size\": %d, "
                 "\"blocks_per_sm\": %d, \"query\": %d, \"us\": %.2f, \"gbps\": %.1f, "
                 "\"fraction\": %.4f}%s\n",
                 r.format.c_str(), r.batch, r.context, r.block_size, r.blocks_per_sm, r.query, r.us,
                 r.gbps, r.fraction, i + 1 < rows.size() ? "," : "");
  }
  std::fprintf(f, "]}\n");
  const bool ok = std::fclose(f) == 0 && std::rename(partial.c_str(), path) == 0;
  if (!ok) std::perror(path);
  return ok;
}

double CopyBandwidth(uint8_t* buf, size_t bytes) {
  cudaEvent_t a, b;
  KVSERVE_CUDA_CHECK(cudaEventCreate(&a));
  KVSERVE_CUDA_CHECK(cudaEventCreate(&b));
  KVSERVE_CUDA_CHECK(cudaMemcpy(buf + bytes, buf, bytes, cudaMemcpyDeviceToDevice));
  const int iters = 10;
  KVSERVE_CUDA_CHECK(cudaEventRecord(a));
  for (int i = 0; i < iters; ++i) {
    KVSERVE_CUDA_CHECK(cudaMemcpyAsync(buf + bytes, buf, bytes, cudaMemcpyDeviceToDevice));
  }
  KVSERVE_CUDA_CHECK(cudaEventRecord(b));
  KVSERVE_CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  KVSERVE_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  return 2.0 * bytes * iters / (ms * 1e-3) / 1e9;  // read + write
}

constexpr int kHeads = 32, kKvHeads = 8, kHeadDim = 128;

struct Options {
  const char* json_path = nullptr;
  bool quick = false, tensor_cores = false, prefetch_k = false, pipelined = false;
  std::string only;  // one configuration, e.g. bf16:64:4096 (for a profiler)
};

// False after printing the usage.
bool ParseOptions(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0 && i + 1 < argc) {
      o->json_path = argv[++i];
    } else if (std::strcmp(argv[i], "--quick") == 0) {
      o->quick = true;
    } else if (std::strcmp(argv[i], "--only") == 0 && i + 1 < argc) {
      o->only = argv[++i];
    } else if (std::strcmp(argv[i], "--tensor-cores") == 0) {
      o->tensor_cores = true;
    } else if (std::strcmp(argv[i], "--prefetch-k") == 0) {
      o->tensor_cores = o->prefetch_k = true;
    } else if (std::strcmp(argv[i], "--pipelined") == 0) {
      o->tensor_cores = o->pipelined = true;
    } else {
      std::fprintf(stderr,
                   "usage: %s [--json FILE] [--quick] [--tensor-cores | --prefetch-k | "
                   "--pipelined] [--only FORMAT:BATCH:CONTEXT]\n",
                   argv[0]);
      return false;
    }
  }
  return true;
}

struct Fmt {
  std::string name;
  KvFormat f;
};

const std::vector<Fmt>& Formats() {
  static const std::vector<Fmt> formats = {
      {"bf16", {KvDType::kBf16, KvGranularity::kNone, 0}},
      {"fp8", {KvDType::kFp8E4M3, KvGranularity::kPerToken, 0}},
      {"int8", {KvDType::kInt8, KvGranularity::kPerToken, 0}},
      {"int4", {KvDType::kInt4, KvGranularity::kPerToken, 0}},
  };
  return formats;
}

struct Config {
  const Fmt* fmt;
  int batch, context, block_size;
  int blocks_per_sm = 0;  // split-KV target (0: the backend's default)
  int query = 1;          // query tokens per sequence, the last of `context`
};

// Every format at every batch × context; block sizes 8 and 32; split-KV targets either side of
// the default; prefill chunks.
std::vector<Config> MakeConfigs(const std::vector<int>& batches, const std::vector<int>& contexts,
                                bool quick) {
  const std::vector<Fmt>& formats = Formats();
  std::vector<Config> configs;
  for (const Fmt& f : formats) {
    for (int b : batches) {
      for (int c : contexts) configs.push_back({&f, b, c, 16});
    }
  }
  for (int bs : {8, 32}) {
    configs.push_back({&formats[0], 16, 4096, bs});
    if (!quick) configs.push_back({&formats[0], 64, 4096, bs});
  }
  // How much split-KV to aim for: thread blocks per SM, either side of the default (8).
  for (int per_sm : {4, 32}) {
    for (auto [b, c] : {std::pair{1, 65536}, {16, 4096}, {64, 4096}, {256, 16384}}) {
      if (quick && b > 16) continue;
      if (c > contexts.back() || b > batches.back()) continue;
      configs.push_back({&formats[0], b, c, 16, per_sm});
      configs.push_back({&formats[3], b, c, 16, per_sm});
    }
  }
  // Prefill chunks: (batch, query tokens, context including them).
  for (auto [b, qn, c] : {std::tuple{1, 2048, 2048}, {1, 512, 8192}, {4, 256, 4096}}) {
    if (quick && c > 4096) continue;
    configs.push_back({&formats[0], b, c, 16, 0, qn});
    configs.push_back({&formats[2], b, c, 16, 0, qn});
  }
  return configs;
}

// The one decode configuration FORMAT:BATCH:CONTEXT names (block 16, default split); empty when
// none does.
std::vector<Config> PickOnly(const std::vector<Config>& configs, const std::string& only) {
  std::vector<Config> picked;
  for (const Config& c : configs) {
    const std::string name =
        c.fmt->name + ":" + std::to_string(c.batch) + ":" + std::to_string(c.context);
    if (name == only && c.block_size == 16 && c.blocks_per_sm == 0 && c.query == 1) {
      picked.push_back(c);
    }
  }
  return picked;
}

// Device memory every configuration reuses: one arena for the largest bf16 cache (K and V), the
// scales, and the queries and outputs.
struct Arena {
  uint8_t* data = nullptr;
  uint16_t* scales = nullptr;
  size_t data_bytes = 0;
  float *q = nullptr, *out = nullptr;
};

// Random bytes with bit 6 cleared: bf16 values below 2 in magnitude, fp8 codes that are never
// NaN, any int8 / int4 code. Scales are fp16 0.01. (The pattern repeats every 64 MiB.) The
// queries are normal.
Arena MakeArena(int64_t max_tokens, size_t q_rows, std::mt19937& rng) {
  Arena a;
  a.data_bytes = size_t(max_tokens) * kKvHeads * kHeadDim * 2 * 2;
  const size_t scale_count = size_t(max_tokens) * kKvHeads * 2 * 2;  // int4: scale + minimum
  KVSERVE_CUDA_CHECK(cudaMalloc(&a.data, a.data_bytes));
  KVSERVE_CUDA_CHECK(cudaMalloc(&a.scales, scale_count * 2));
  std::vector<uint8_t> pattern(size_t{64} << 20);
  for (size_t i = 0; i < pattern.size(); i += 4) {
    const uint32_t x = rng() & 0xbfbfbfbfu;
    std::memcpy(&pattern[i], &x, 4);
  }
  FillRepeated(a.data, a.data_bytes, pattern);
  const uint16_t scale_bits = 0x211f;
  std::vector<uint8_t> scale_pattern(4096);
  for (size_t i = 0; i < scale_pattern.size(); i += 2) {
    std::memcpy(&scale_pattern[i], &scale_bits, 2);
  }
  FillRepeated(a.scales, scale_count * 2, scale_pattern);
  KVSERVE_CUDA_CHECK(cudaMalloc(&a.q, sizeof(float) * q_rows * kHeads * kHeadDim));
  KVSERVE_CUDA_CHECK(cudaMalloc(&a.out, sizeof(float) * q_rows * kHeads * kHeadDim));
  std::vector<float> q_host(q_rows * kHeads * kHeadDim);
  for (float& x : q_host) x = std::normal_distribution<float>()(rng);
  KVSERVE_CUDA_CHECK(
      cudaMemcpy(a.q, q_host.data(), q_host.size() * sizeof(float), cudaMemcpyHostToDevice));
  KVSERVE_CUDA_CHECK(cudaDeviceSynchronize());
  return a;
}

// A device copy of `v`.
int32_t* ToDevice(const std::vector<int32_t>& v) {
  int32_t* d = nullptr;
  KVSERVE_CUDA_CHECK(cudaMalloc(&d, v.size() * 4));
  KVSERVE_CUDA_CHECK(cudaMemcpy(d, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
  return d;
}

// Times `p` on `be`: one warm-up, one timed call to pick the repetitions (about 25 ms), then
// their average in microseconds.
double TimeAttention(Backend& be, const PagedAttentionParams& p) {
  auto stream = static_cast<cudaStream_t>(CudaComputeStream(be));
  cudaEvent_t start, stop;
  KVSERVE_CUDA_CHECK(cudaEventCreate(&start));
  KVSERVE_CUDA_CHECK(cudaEventCreate(&stop));
  be.PagedAttention(p);  // warm-up (and workspace growth)
  be.Synchronize();
  KVSERVE_CUDA_CHECK(cudaEventRecord(start, stream));
  be.PagedAttention(p);
  KVSERVE_CUDA_CHECK(cudaEventRecord(stop, stream));
  KVSERVE_CUDA_CHECK(cudaEventSynchronize(stop));
  float one_ms = 0;
  KVSERVE_CUDA_CHECK(cudaEventElapsedTime(&one_ms, start, stop));
  const int iters = std::clamp(static_cast<int>(25.0f / std::max(one_ms, 1e-3f)), 3, 200);
  KVSERVE_CUDA_CHECK(cudaEventRecord(start, stream));
  for (int i = 0; i < iters; ++i) be.PagedAttention(p);
  KVSERVE_CUDA_CHECK(cudaEventRecord(stop, stream));
  KVSERVE_CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0;
  KVSERVE_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  KVSERVE_CUDA_CHECK(cudaEventDestroy(start));
  KVSERVE_CUDA_CHECK(cudaEventDestroy(stop));
  return 1e3 * ms / iters;
}

// One configuration on a shuffled block table: its row.
Row Measure(Backend& be, const Config& cfg, const Arena& a, double copy_gbps, std::mt19937& rng) {
  const KvFormat& f = cfg.fmt->f;
  const int bs = cfg.block_size;
  const int64_t blocks_per_seq = (cfg.context + bs - 1) / bs;
  const int64_t num_blocks = blocks_per_seq * cfg.batch;
  const int64_t k_bytes = num_blocks * kKvHeads * bs * f.RowBytes(kHeadDim);
  const int64_t s_count = num_blocks * kKvHeads * f.ScaleEntries(bs, kHeadDim);
  KvCacheView cache;
  cache.k = a.data;
  cache.v = a.data + k_bytes;
  cache.k_scales = f.quantized() ? a.scales : nullptr;
  cache.v_scales = f.quantized() ? a.scales + s_count : nullptr;
  cache.k_format = cache.v_format = f;
  cache.num_blocks = num_blocks;
  cache.num_kv_heads = kKvHeads;
  cache.block_size = bs;
  cache.head_dim = kHeadDim;
  std::vector<int32_t> table(num_blocks);
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);
  std::vector<int32_t> qs(cfg.batch), ql(cfg.batch, cfg.query), cl(cfg.batch, cfg.context);
  for (int i = 0; i < cfg.batch; ++i) qs[i] = i * cfg.query;
  int32_t *dtable = ToDevice(table), *dqs = ToDevice(qs), *dql = ToDevice(ql), *dcl = ToDevice(cl);
  KVSERVE_CUDA_CHECK(cudaDeviceSynchronize());
  PagedAttentionParams p;
  p.q = a.q;
  p.q_stride = kHeads * kHeadDim;
  p.out = a.out;
  p.cache = cache;
  p.query_start = dqs;
  p.query_len = dql;
  p.context_len = dcl;
  p.block_tables = dtable;
  p.num_seqs = cfg.batch;
  p.max_blocks_per_seq = blocks_per_seq;
  p.num_heads = kHeads;
  p.scale = 0.088f;
  p.max_query_len = cfg.query;
  p.max_context_len = cfg.context;
  const double us = TimeAttention(be, p);
  for (int32_t* ptr : {dtable, dqs, dql, dcl}) KVSERVE_CUDA_CHECK(cudaFree(ptr));
  // Bytes the kernel must read: K and V data and scales of every token, the queries and the
  // output written.
  const double bytes = 2.0 * k_bytes + 2.0 * 2 * s_count +
                       2.0 * sizeof(float) * cfg.batch * cfg.query * kHeads * kHeadDim;
  const double gbps = bytes / (us * 1e-6) / 1e9;
  return {cfg.fmt->name, cfg.batch,        cfg.context, bs, cfg.blocks_per_sm, us,
          gbps,          gbps / copy_gbps, cfg.query};
}

int Main(int argc, char** argv) {
  Options o;
  if (!ParseOptions(argc, argv, &o)) return 2;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "no CUDA device\n");
    return 1;
  }
  const std::vector<int> batches =
      o.quick ? std::vector<int>{1, 16} : std::vector<int>{1, 16, 64, 256};
  const std::vector<int> contexts =
      o.quick ? std::vector<int>{1024, 4096} : std::vector<int>{1024, 4096, 16384, 65536};
  std::vector<Config> configs = MakeConfigs(batches, contexts, o.quick);
  if (!o.only.empty()) {
    configs = PickOnly(configs, o.only);
    if (configs.empty()) {
      std::fprintf(stderr, "--only %s matches no configuration\n", o.only.c_str());
      return 2;
    }
  }
  // One backend per split-KV target (0: the default).
  std::vector<std::unique_ptr<Backend>> backends(129);
  auto backend_for = [&](int per_sm) -> Backend& {
    if (backends[per_sm] == nullptr) {
      auto b = CreateCudaBackend({.attention_blocks_per_sm = per_sm,
                                  .attention_tensor_cores = o.tensor_cores,
                                  .attention_prefetch_k = o.prefetch_k,
                                  .attention_pipelined = o.pipelined});
      if (!b.ok()) {
        std::fprintf(stderr, "%s\n", std::string(b.status().message()).c_str());
        std::exit(1);
      }
      backends[per_sm] = *std::move(b);
    }
    return *backends[per_sm];
  };
  backend_for(0);
  std::mt19937 fill_rng(12345);
  const Arena arena =
      MakeArena(int64_t{batches.back()} * contexts.back(),
                static_cast<size_t>(std::max(batches.back(), kMaxPrefillTokens)), fill_rng);
  const double copy_gbps =
      CopyBandwidth(arena.data, std::min<size_t>(arena.data_bytes / 2, size_t{4} << 30));
  std::printf("device-to-device copy: %.0f GB/s (read + write)\n", copy_gbps);
  std::printf("%-6s %6s %6s %7s %5s %6s %11s %9s %8s\n", "format", "batch", "query", "context",
              "block", "per_sm", "time_us", "GB/s", "of_copy");
  std::fflush(stdout);
  std::mt19937 rng(1);
  std::vector<Row> rows;
  for (const Config& cfg : configs) {
    rows.push_back(Measure(backend_for(cfg.blocks_per_sm), cfg, arena, copy_gbps, rng));
    PrintRow(rows.back());
    if (o.json_path != nullptr &&
        !WriteJson(o.json_path, copy_gbps, o.tensor_cores, o.prefetch_k, o.pipelined, rows)) {
      return 1;
    }
  }
  for (void* ptr : {static_cast<void*>(arena.data), static_cast<void*>(arena.scales),
                    static_cast<void*>(arena.q), static_cast<void*>(arena.out)}) {
    KVSERVE_CUDA_CHECK(cudaFree(ptr));
  }
  return 0;
}

}  // namespace
}  // namespace kvserve::kernels

int main(int argc, char** argv) { return kvserve::kernels::Main(argc, argv); }
