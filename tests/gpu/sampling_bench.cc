// GPU sampling (kernels/cuda/ops/sampling.cu) against the CPU twin on the same rows: time per step
// for batch 1 / 64 / 256 × vocabulary 128,256 (Llama 3) and 151,936 (Qwen 2/3) with the
// parameter mixes a server sees (greedy, temperature alone, top-p, top-k + top-p + min-p),
// and whether every GPU token equals the CPU's; plus the logprobs (top 5) of those draws. Logits
// are N(0, 3²) with a few spikes, like a language model's. Then the logits adjustments
// (kernels/logits_processing.h: every penalty over 2,000 distinct tokens per row, two biases),
// their lists uploaded as the engine does each step, against the CPU twin bit for bit. Prints a
// table; exits 1 on a mismatch.
//
//   sampling_bench [--quick]
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/device/cuda_check.h"

namespace kvserve::kernels {
namespace {

// Mean time of `op` on the backend over 20 runs after a warm-up, in microseconds.
template <typename Op>
double MeanMicros(Backend& backend, const Op& op) {
  op();
  backend.Synchronize();
  const int iters = 20;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) op();
  backend.Synchronize();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
             .count() /
         iters;
}

struct Mix {
  const char* name;
  float temperature, top_p, min_p;
  int top_k;
};

// Device buffers for batches of up to `max_batch` rows of `vocab` logits.
struct DeviceBuffers {
  DeviceBuffers(const std::vector<float>& logits, int max_batch) {
    KVSERVE_CUDA_CHECK(cudaMalloc(&logits_, logits.size() * sizeof(float)));
    KVSERVE_CUDA_CHECK(cudaMalloc(&requests, max_batch * sizeof(SampleRequest)));
    KVSERVE_CUDA_CHECK(cudaMalloc(&tokens, max_batch * sizeof(int32_t)));
    KVSERVE_CUDA_CHECK(cudaMalloc(&logprob_requests, max_batch * sizeof(LogprobRequest)));
    KVSERVE_CUDA_CHECK(cudaMalloc(&logprobs, max_batch * sizeof(float)));
    KVSERVE_CUDA_CHECK(cudaMalloc(&top_logprobs, max_batch * kMaxTopLogprobs * sizeof(float)));
    KVSERVE_CUDA_CHECK(cudaMalloc(&top_ids, max_batch * kMaxTopLogprobs * sizeof(int32_t)));
    KVSERVE_CUDA_CHECK(cudaMalloc(&ranks, max_batch * sizeof(int32_t)));
    KVSERVE_CUDA_CHECK(
        cudaMemcpy(logits_, logits.data(), logits.size() * sizeof(float), cudaMemcpyHostToDevice));
  }
  ~DeviceBuffers() {
    for (void* ptr : {static_cast<void*>(logits_), static_cast<void*>(requests),
                      static_cast<void*>(tokens), static_cast<void*>(logprob_requests),
                      static_cast<void*>(logprobs), static_cast<void*>(top_logprobs),
                      static_cast<void*>(top_ids), static_cast<void*>(ranks)}) {
      cudaFree(ptr);
    }
  }
  float* logits_ = nullptr;
  SampleRequest* requests = nullptr;
  int32_t* tokens = nullptr;
  LogprobRequest* logprob_requests = nullptr;
  float *logprobs = nullptr, *top_logprobs = nullptr;
  int32_t *top_ids = nullptr, *ranks = nullptr;
};

// N(0, 3²) logits with four likely tokens per row.
std::vector<float> MakeLogits(int rows, int64_t vocab, std::mt19937& rng) {
  std::vector<float> logits(size_t(rows) * vocab);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (float& x : logits) x = normal(rng);
  for (int r = 0; r < rows; ++r) {
    for (int s = 0; s < 4; ++s) logits[size_t(r) * vocab + rng() % vocab] += 12.0f + s;
  }
  return logits;
}

// One mix at one batch: GPU and CPU draws timed and compared, then the logprobs (top 5) of the
// draws timed; prints the row. Returns whether every token matched.
bool RunMix(Backend& gpu, Backend& cpu, const Mix& m, int batch, int64_t vocab,
            const std::vector<float>& logits, DeviceBuffers& d) {
  std::vector<SampleRequest> requests(batch);
  for (int r = 0; r < batch; ++r) {
    requests[r] = {.row = r,
                   .temperature = m.temperature,
                   .top_k = m.top_k,
                   .top_p = m.top_p,
                   .min_p = m.min_p,
                   .seed = static_cast<uint64_t>(1000 + r),
                   .step = 7};
  }
  KVSERVE_CUDA_CHECK(cudaMemcpy(d.requests, requests.data(), batch * sizeof(SampleRequest),
                                cudaMemcpyHostToDevice));
  KVSERVE_CUDA_CHECK(cudaDeviceSynchronize());
  SampleParams p;
  p.logits = d.logits_;
  p.num_rows = batch;
  p.vocab = vocab;
  p.shard_vocab = vocab;
  p.requests = d.requests;
  p.num_requests = batch;
  p.tokens = d.tokens;
  const double gpu_us = MeanMicros(gpu, [&] { gpu.Sample(p); });
  std::vector<int32_t> got(batch), want(batch);
  KVSERVE_CUDA_CHECK(
      cudaMemcpy(got.data(), d.tokens, batch * sizeof(int32_t), cudaMemcpyDeviceToHost));
  p.logits = logits.data();
  p.requests = requests.data();
  p.tokens = want.data();
  const auto c0 = std::chrono::steady_clock::now();
  cpu.Sample(p);
  const double cpu_us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - c0).count();
  // Logprobs of these draws with the top 5 (what an OpenAI `logprobs: 5` request costs).
  std::vector<LogprobRequest> lq(batch);
  for (int r = 0; r < batch; ++r) lq[r] = {r, r, 5};
  KVSERVE_CUDA_CHECK(cudaMemcpy(d.logprob_requests, lq.data(), batch * sizeof(LogprobRequest),
                                cudaMemcpyHostToDevice));
  KVSERVE_CUDA_CHECK(cudaDeviceSynchronize());
  LogprobsParams lp;
  lp.logits = d.logits_;
  lp.num_rows = batch;
  lp.vocab = vocab;
  lp.shard_vocab = vocab;
  lp.tokens = d.tokens;
  lp.requests = d.logprob_requests;
  lp.num_requests = batch;
  lp.logprob = d.logprobs;
  lp.rank = d.ranks;
  lp.top_ids = d.top_ids;
  lp.top_logprobs = d.top_logprobs;
  const double lp_us = MeanMicros(gpu, [&] { gpu.Logprobs(lp); });
  const bool match = got == want;
  std::printf("%-24s %5d %7ld %10.1f %10.1f %8.1f %10.1f %s\n", m.name, batch, long(vocab), gpu_us,
              cpu_us, cpu_us / gpu_us, lp_us, match ? "same" : "DIFFER");
  std::fflush(stdout);  // a run cut short by its timeout still shows the rows it measured
  return match;
}

// The adjustments of `batch` rows (a sequence of 2,000 distinct tokens each, every penalty on,
// two biases): their lists uploaded and the kernel run, timed as one step's cost; the adjusted
// rows compared with the CPU twin's. Prints the row; returns whether they are the same bits.
// `with_mask`: each row also has a structured-outputs bitmask (random, about half the ids
// allowed), uploaded with the lists each time as the engine does per step.
bool RunAdjust(Backend& gpu, Backend& cpu, int batch, int64_t vocab, std::vector<float> logits,
               DeviceBuffers& d, std::mt19937& rng, bool with_mask) {
  std::vector<LogitsAdjustment> rows;
  std::vector<TokenBias> biases;
  std::vector<TokenCount> counts;
  std::vector<uint32_t> mask_words;
  const int64_t words = (vocab + 31) / 32;
  for (int r = 0; r < batch; ++r) {
    LogitsAdjustment a{
        .row = r, .repetition_penalty = 1.1f, .frequency_penalty = 0.5f, .presence_penalty = 0.5f};
    a.bias_begin = static_cast<int32_t>(biases.size());
    biases.push_back({static_cast<int32_t>(rng() % vocab), 2.0f});
    biases.push_back({static_cast<int32_t>(vocab - 1), -100.0f});
    if (biases[biases.size() - 2].id == vocab - 1) biases.pop_back();
    a.bias_end = static_cast<int32_t>(biases.size());
    a.counts_begin = static_cast<int32_t>(counts.size());
    const int64_t start = rng() % vocab;
    for (int i = 0; i < 2000; ++i) {  // distinct ids: a stride walk
      counts.push_back({static_cast<int32_t>((start + int64_t{i} * 61) % vocab),
                        static_cast<int32_t>(i % 4), i % 3 == 0 ? 1 : 0});
    }
    a.counts_end = static_cast<int32_t>(counts.size());
    if (with_mask) {
      a.mask_begin = static_cast<int32_t>(mask_words.size());
      for (int64_t w = 0; w < words; ++w) mask_words.push_back(static_cast<uint32_t>(rng()));
    }
    rows.push_back(a);
  }
  std::vector<uint8_t> host;
  auto pack = [&](const auto& v) {
    const size_t at = host.size(), bytes = v.size() * sizeof(v[0]);
    host.resize(at + (bytes + 7) / 8 * 8);
    std::memcpy(host.data() + at, v.data(), bytes);
    return at;
  };
  const size_t rows_at = pack(rows), biases_at = pack(biases), counts_at = pack(counts);
  const size_t mask_at = pack(mask_words);
  uint8_t* lists = nullptr;
  KVSERVE_CUDA_CHECK(cudaMalloc(&lists, host.size()));
  AdjustLogitsParams p;
  p.logits = d.logits_;
  p.num_rows = batch;
  p.vocab = vocab;
  p.shard_vocab = vocab;
  p.rows = reinterpret_cast<const LogitsAdjustment*>(lists + rows_at);
  p.num_adjustments = batch;
  p.biases = reinterpret_cast<const TokenBias*>(lists + biases_at);
  p.counts = reinterpret_cast<const TokenCount*>(lists + counts_at);
  if (with_mask) p.mask_words = reinterpret_cast<const uint32_t*>(lists + mask_at);
  const double us = MeanMicros(gpu, [&] {
    gpu.Upload(lists, host.data(), host.size());
    gpu.AdjustLogits(p);
  });
  // Once more on fresh rows, for the comparison.
  const size_t n = size_t(batch) * vocab;
  KVSERVE_CUDA_CHECK(
      cudaMemcpy(d.logits_, logits.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  gpu.AdjustLogits(p);
  std::vector<float> got(n);
  KVSERVE_CUDA_CHECK(cudaMemcpy(got.data(), d.logits_, n * sizeof(float), cudaMemcpyDeviceToHost));
  AdjustLogitsParams c = p;
  c.logits = logits.data();
  c.rows = rows.data();
  c.biases = biases.data();
  c.counts = counts.data();
  if (with_mask) c.mask_words = mask_words.data();
  cpu.AdjustLogits(c);
  const bool same = std::memcmp(got.data(), logits.data(), n * sizeof(float)) == 0;
  KVSERVE_CUDA_CHECK(cudaFree(lists));
  std::printf("%-24s %5d %7ld %10.1f %10s %8s %10s %s\n",
              with_mask ? "adjust + mask" : "adjust (2000 tokens)", batch, long(vocab), us, "", "",
              "", same ? "same" : "DIFFER");
  std::fflush(stdout);
  return same;
}

int Main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  auto gpu_or = CreateCudaBackend({});
  if (!gpu_or.ok()) {
    std::fprintf(stderr, "%s\n", std::string(gpu_or.status().message()).c_str());
    return 1;
  }
  Backend& gpu = **gpu_or;
  auto cpu = CreateCpuBackend({});
  const std::vector<int> batches = quick ? std::vector<int>{1, 64} : std::vector<int>{1, 64, 256};
  const std::vector<int64_t> vocabs = {128256, 151936};
  const Mix mixes[] = {{"greedy", 0.0f, 1.0f, 0.0f, 0},
                       {"T0.7", 0.7f, 1.0f, 0.0f, 0},
                       {"T0.7,p0.9", 0.7f, 0.9f, 0.0f, 0},
                       {"T0.7,k50,p0.9,minp0.05", 0.7f, 0.9f, 0.05f, 50}};
  std::mt19937 rng(3);
  std::printf("%-24s %5s %7s %10s %10s %8s %10s %s\n", "mix", "batch", "vocab", "gpu_us", "cpu_us",
              "x_cpu", "logprob_us", "tokens");
  bool all_match = true;
  for (int64_t vocab : vocabs) {
    const std::vector<float> logits = MakeLogits(batches.back(), vocab, rng);
    DeviceBuffers d(logits, batches.back());
    for (int batch : batches) {
      for (const Mix& m : mixes) all_match &= RunMix(gpu, *cpu, m, batch, vocab, logits, d);
    }
    for (int batch : batches) {
      for (bool with_mask : {false, true}) {
        all_match &= RunAdjust(gpu, *cpu, batch, vocab,
                               std::vector<float>(logits.begin(), logits.begin() + batch * vocab),
                               d, rng, with_mask);
      }
    }
  }
  return all_match ? 0 : 1;
}

}  // namespace
}  // namespace kvserve::kernels

int main(int argc, char** argv) { return kvserve::kernels::Main(argc, argv); }
