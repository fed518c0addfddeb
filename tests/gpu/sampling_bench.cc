// GPU sampling (kernels/cuda/sampling.cu) against the CPU twin on the same rows: time per step
// for batch 1 / 64 / 256 × vocabulary 128,256 (Llama 3) and 151,936 (Qwen 2/3) with the
// parameter mixes a server sees (greedy, temperature alone, top-p, top-k + top-p + min-p),
// and whether every GPU token equals the CPU's; plus the logprobs (top 5) of those draws. Logits
// are N(0, 3²) with a few spikes, like a language model's. Prints a table; exits 1 on a mismatch.
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
#include "kernels/cuda/cuda_check.h"

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
    KVSERVE_CUDA_CHECK(
        cudaMemcpy(logits_, logits.data(), logits.size() * sizeof(float), cudaMemcpyHostToDevice));
  }
  ~DeviceBuffers() {
    for (void* ptr :
         {static_cast<void*>(logits_), static_cast<void*>(requests), static_cast<void*>(tokens),
          static_cast<void*>(logprob_requests), static_cast<void*>(logprobs),
          static_cast<void*>(top_logprobs), static_cast<void*>(top_ids)}) {
      cudaFree(ptr);
    }
  }
  float* logits_ = nullptr;
  SampleRequest* requests = nullptr;
  int32_t* tokens = nullptr;
  LogprobRequest* logprob_requests = nullptr;
  float *logprobs = nullptr, *top_logprobs = nullptr;
  int32_t* top_ids = nullptr;
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
  lp.top_ids = d.top_ids;
  lp.top_logprobs = d.top_logprobs;
  const double lp_us = MeanMicros(gpu, [&] { gpu.Logprobs(lp); });
  const bool match = got == want;
  std::printf("%-24s %5d %7ld %10.1f %10.1f %8.1f %10.1f %s\n", m.name, batch, long(vocab), gpu_us,
              cpu_us, cpu_us / gpu_us, lp_us, match ? "same" : "DIFFER");
  std::fflush(stdout);  // a run cut short by its timeout still shows the rows it measured
  return match;
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
  }
  return all_match ? 0 : 1;
}

}  // namespace
}  // namespace kvserve::kernels

int main(int argc, char** argv) { return kvserve::kernels::Main(argc, argv); }
