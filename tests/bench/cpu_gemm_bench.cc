// The CPU backend's Gemm at decode-sized batches, beside OpenBLAS's sgemm on the same operands:
// y[m × 8192] = x[m × 2048] · Wᵀ with W a float32 [8192 × 2048] weight (64 MiB, beyond the
// caches, as a model's weights are), on 2 threads. Up to kGemvMaxRows rows the backend runs
// one sgemv per row (kernels/cpu/cpu_backend.cc); this shows why.
#include <cblas.h>

#include <random>
#include <vector>

#include "benchmark/benchmark.h"
#include "kernels/backend.h"

extern "C" void openblas_set_num_threads(int num_threads);

namespace kvserve::kernels {
namespace {

constexpr int64_t kN = 8192, kK = 2048;
constexpr int kThreads = 2;

struct Operands {
  std::vector<float> w, x, y;
  explicit Operands(int64_t m) : w(kN * kK), x(m * kK), y(m * kN) {
    std::mt19937 rng(1);
    std::normal_distribution<float> normal(0.0f, 0.02f);
    for (float& v : w) v = normal(rng);
    for (float& v : x) v = normal(rng);
  }
};

void BM_Sgemm(benchmark::State& state) {
  const int64_t m = state.range(0);
  Operands o(m);
  openblas_set_num_threads(kThreads);
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), kN, kK, 1.0f,
                o.x.data(), kK, o.w.data(), kK, 0.0f, o.y.data(), kN);
    benchmark::DoNotOptimize(o.y.data());
  }
  state.SetBytesProcessed(state.iterations() * kN * kK * 4);
}

void BM_BackendGemm(benchmark::State& state) {
  const int64_t m = state.range(0);
  Operands o(m);
  std::unique_ptr<Backend> cpu = CreateCpuBackend({.num_threads = kThreads});
  for (auto _ : state) {
    cpu->Gemm({.x = o.x.data(), .w = o.w.data(), .y = o.y.data(), .m = m, .n = kN, .k = kK});
    benchmark::DoNotOptimize(o.y.data());
  }
  state.SetBytesProcessed(state.iterations() * kN * kK * 4);
}

BENCHMARK(BM_Sgemm)->Arg(1)->Arg(2)->Arg(3)->Arg(4)->Arg(8)->UseRealTime();
BENCHMARK(BM_BackendGemm)->Arg(1)->Arg(2)->Arg(3)->Arg(4)->Arg(8)->UseRealTime();

}  // namespace
}  // namespace kvserve::kernels

BENCHMARK_MAIN();
