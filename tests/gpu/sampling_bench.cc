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
    const int max_batch = batches.back();
    std::vector<float> logits(size_t(max_batch) * vocab);
    std::normal_distribution<float> normal(0.0f, 3.0f);
    for (float& x : logits) x = normal(rng);
    for (int r = 0; r < max_batch; ++r) {  // a few likely tokens per row
      for (int s = 0; s < 4; ++s) logits[size_t(r) * vocab + rng() % vocab] += 12.0f + s;
    }
    float* d_logits = nullptr;
    SampleRequest* d_requests = nullptr;
    int32_t* d_tokens = nullptr;
    KVSERVE_CUDA_CHECK(cudaMalloc(&d_logits, logits.size() * sizeof(float)));
    KVSERVE_CUDA_CHECK(cudaMalloc(&d_requests, max_batch * sizeof(SampleRequest)));
    KVSERVE_CUDA_CHECK(cudaMalloc(&d_tokens, max_batch * sizeof(int32_t)));
    LogprobRequest* d_lq = nullptr;
    float *d_lp = nullptr, *d_top_lp = nullptr;
    int32_t* d_top_ids = nullptr;
    KVSERVE_CUDA_CHECK(cudaMalloc(&d_lq, max_batch * sizeof(LogprobRequest)));
    KVSERVE_CUDA_CHECK(cudaMalloc(&d_lp, max_batch * sizeof(float)));
    KVSERVE_CUDA_CHECK(cudaMalloc(&d_top_lp, max_batch * kMaxTopLogprobs * sizeof(float)));
    KVSERVE_CUDA_CHECK(cudaMalloc(&d_top_ids, max_batch * kMaxTopLogprobs * sizeof(int32_t)));
    KVSERVE_CUDA_CHECK(
        cudaMemcpy(d_logits, logits.data(), logits.size() * sizeof(float), cudaMemcpyHostToDevice));
    for (int batch : batches) {
      for (const Mix& m : mixes) {
        std::vector<SampleRequest> requests(batch);
        for (int r = 0; r < batch; ++r) {
          requests[r].row = r;
          requests[r].temperature = m.temperature;
          requests[r].top_p = m.top_p;
          requests[r].min_p = m.min_p;
          requests[r].top_k = m.top_k;
          requests[r].seed = 1000 + r;
          requests[r].step = 7;
        }
        KVSERVE_CUDA_CHECK(cudaMemcpy(d_requests, requests.data(), batch * sizeof(SampleRequest),
                                      cudaMemcpyHostToDevice));
        KVSERVE_CUDA_CHECK(cudaDeviceSynchronize());
        SampleParams p;
        p.logits = d_logits;
        p.num_rows = batch;
        p.vocab = vocab;
        p.shard_vocab = vocab;
        p.requests = d_requests;
        p.num_requests = batch;
        p.tokens = d_tokens;
        const double gpu_us = MeanMicros(gpu, [&] { gpu.Sample(p); });
        std::vector<int32_t> got(batch), want(batch);
        KVSERVE_CUDA_CHECK(
            cudaMemcpy(got.data(), d_tokens, batch * sizeof(int32_t), cudaMemcpyDeviceToHost));
        p.logits = logits.data();
        p.requests = requests.data();
        p.tokens = want.data();
        const auto c0 = std::chrono::steady_clock::now();
        cpu->Sample(p);
        const double cpu_us =
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - c0)
                .count();
        const bool match = got == want;
        all_match = all_match && match;
        // Logprobs of these draws with the top 5 (what an OpenAI `logprobs: 5` request costs).
        std::vector<LogprobRequest> lq(batch);
        for (int r = 0; r < batch; ++r) lq[r] = {r, r, 5};
        KVSERVE_CUDA_CHECK(
            cudaMemcpy(d_lq, lq.data(), batch * sizeof(LogprobRequest), cudaMemcpyHostToDevice));
        KVSERVE_CUDA_CHECK(cudaDeviceSynchronize());
        LogprobsParams lp;
        lp.logits = d_logits;
        lp.num_rows = batch;
        lp.vocab = vocab;
        lp.shard_vocab = vocab;
        lp.tokens = d_tokens;
        lp.requests = d_lq;
        lp.num_requests = batch;
        lp.logprob = d_lp;
        lp.top_ids = d_top_ids;
        lp.top_logprobs = d_top_lp;
        const double lp_us = MeanMicros(gpu, [&] { gpu.Logprobs(lp); });
        std::printf("%-24s %5d %7ld %10.1f %10.1f %8.1f %10.1f %s\n", m.name, batch, long(vocab),
                    gpu_us, cpu_us, cpu_us / gpu_us, lp_us, match ? "same" : "DIFFER");
        std::fflush(stdout);  // a run cut short by its timeout still shows the rows it measured
      }
    }
    cudaFree(d_logits);
    for (void* ptr : {static_cast<void*>(d_lq), static_cast<void*>(d_lp),
                      static_cast<void*>(d_top_lp), static_cast<void*>(d_top_ids)}) {
      cudaFree(ptr);
    }
    cudaFree(d_requests);
    cudaFree(d_tokens);
  }
  return all_match ? 0 : 1;
}

}  // namespace
}  // namespace kvserve::kernels

int main(int argc, char** argv) { return kvserve::kernels::Main(argc, argv); }
