// The CPU twin of sampling (kernels/cpu/sampling.cc) on vocabulary-sized rows: one draw for
// Llama 3 (128,256) and Qwen (151,936) vocabularies with the parameter mixes a server sees.
// Logits are N(0, 3²) with a few spikes. Arguments: vocabulary, mix (0 greedy, 1 temperature,
// 2 top-p 0.9, 3 top-k 50 + top-p 0.9 + min-p 0.05). BM_TopLogprobs: one position's logprob,
// rank and top_n alternatives (20, or the whole vocabulary: top_logprobs -1, ranked on the host).
#include <random>
#include <vector>

#include "benchmark/benchmark.h"
#include "kernels/cpu/sampling.h"

namespace kvserve::kernels {
namespace {

std::vector<float> Logits(int64_t vocab) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> l(vocab);
  for (float& x : l) x = normal(rng);
  for (int s = 0; s < 4; ++s) l[rng() % vocab] += 12.0f + s;
  return l;
}

SampleRequest Mix(int mix) {
  SampleRequest r;
  if (mix == 0) return r;
  r.temperature = 0.7f;
  if (mix >= 2) r.top_p = 0.9f;
  if (mix == 3) {
    r.top_k = 50;
    r.min_p = 0.05f;
  }
  return r;
}

void BM_SampleRow(benchmark::State& state) {
  const int64_t vocab = state.range(0);
  const std::vector<float> logits = Logits(vocab);
  SampleRequest r = Mix(static_cast<int>(state.range(1)));
  for (auto _ : state) {
    ++r.step;
    benchmark::DoNotOptimize(cpu::SampleRow(logits.data(), vocab, r));
  }
}
BENCHMARK(BM_SampleRow)
    ->ArgsProduct({{128256, 151936}, {0, 1, 2, 3}})
    ->Unit(benchmark::kMicrosecond);

void BM_TopLogprobs(benchmark::State& state) {
  const int64_t vocab = state.range(0);
  const int top_n =
      state.range(1) == 0 ? static_cast<int>(vocab) : static_cast<int>(state.range(1));
  const std::vector<float> logits = Logits(vocab);
  std::vector<int32_t> ids(top_n);
  std::vector<float> values(top_n);
  float logprob = 0;
  int32_t rank = 0;
  for (auto _ : state) {
    cpu::TopLogprobs(logits.data(), vocab, 5, top_n, &logprob, &rank, ids.data(), values.data());
    benchmark::DoNotOptimize(values.data());
  }
}
// Second argument: top_n (0: the whole vocabulary).
BENCHMARK(BM_TopLogprobs)->ArgsProduct({{128256, 151936}, {20, 0}})->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace kvserve::kernels

BENCHMARK_MAIN();
