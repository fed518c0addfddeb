// One decode step of the tiny fixture models on the CPU backend at batch 1, 16 and 64 with
// 256 tokens of context each: the engine's whole step (schedule, forward, sample); the second
// argument 1 turns every penalty on (presence, frequency, repetition) with a logit_bias, for
// their cost side by side.
#include <cstdlib>
#include <string>

#include "benchmark/benchmark.h"
#include "glog/logging.h"
#include "worker/engine.h"

namespace kvserve::worker {
namespace {

std::string Fixture(const char* model) {
  const char* env = std::getenv("KVSERVE_FIXTURES");
  return std::string(env != nullptr ? env : KVSERVE_SOURCE_DIR "/tests/fixtures/models") + "/" +
         model;
}

void BM_DecodeStep(benchmark::State& state, const char* model) {
  const int batch = static_cast<int>(state.range(0));
  const bool penalties = state.range(1) != 0;
  EngineConfig config;
  config.model_dir = Fixture(model);
  config.max_model_len = 4096;
  config.cache.num_blocks = batch * (4096 / 16);
  config.scheduler.max_num_seqs = batch;
  config.scheduler.max_num_batched_tokens = 8192;
  auto engine = Engine::Create(config);
  if (!engine.ok()) {
    state.SkipWithError(std::string(engine.status().message()).c_str());
    return;
  }
  for (int i = 0; i < batch; ++i) {
    RequestInput in;
    in.request_id = std::to_string(i);
    for (int j = 0; j < 256; ++j) in.prompt.push_back((5 + i + 7 * j) % 1000);
    in.max_tokens = 3000;
    in.sampling.ignore_eos = true;
    if (penalties) {
      in.sampling.presence_penalty = 0.5f;
      in.sampling.frequency_penalty = 0.5f;
      in.sampling.repetition_penalty = 1.1f;
      in.sampling.logit_bias = {{3, 1.0f}, {500, -1.0f}};
    }
    CHECK((*engine)->AddRequest(in).ok());
  }
  CHECK((*engine)->Step().ok());  // prefill
  for (auto _ : state) {
    auto outs = (*engine)->Step();
    benchmark::DoNotOptimize(outs);
  }
  state.SetItemsProcessed(state.iterations() * batch);
  state.counters["tokens_per_s"] = benchmark::Counter(
      static_cast<double>(state.iterations() * batch), benchmark::Counter::kIsRate);
}
BENCHMARK_CAPTURE(BM_DecodeStep, tiny_llama3, "tiny-llama3")
    ->ArgsProduct({{1, 16, 64}, {0, 1}})
    ->Unit(benchmark::kMicrosecond)
    ->Iterations(200);
BENCHMARK_CAPTURE(BM_DecodeStep, tiny_qwen2, "tiny-qwen2")
    ->ArgsProduct({{1, 16, 64}, {0, 1}})
    ->Unit(benchmark::kMicrosecond)
    ->Iterations(200);
BENCHMARK_CAPTURE(BM_DecodeStep, tiny_qwen3, "tiny-qwen3")
    ->ArgsProduct({{1, 16, 64}, {0, 1}})
    ->Unit(benchmark::kMicrosecond)
    ->Iterations(200);

}  // namespace
}  // namespace kvserve::worker

BENCHMARK_MAIN();
