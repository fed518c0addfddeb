// One decode step of the tiny fixture models on the CPU backend at batch 1, 16 and 64 with
// 256 tokens of context each: the engine's whole step (schedule, forward, sample).
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
    in.prompt.assign(256, 5 + i);
    in.max_tokens = 3000;
    in.sampling.ignore_eos = true;
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
    ->Arg(1)
    ->Arg(16)
    ->Arg(64)
    ->Unit(benchmark::kMicrosecond)
    ->Iterations(200);
BENCHMARK_CAPTURE(BM_DecodeStep, tiny_qwen2, "tiny-qwen2")
    ->Arg(1)
    ->Arg(16)
    ->Arg(64)
    ->Unit(benchmark::kMicrosecond)
    ->Iterations(200);
BENCHMARK_CAPTURE(BM_DecodeStep, tiny_qwen3, "tiny-qwen3")
    ->Arg(1)
    ->Arg(16)
    ->Arg(64)
    ->Unit(benchmark::kMicrosecond)
    ->Iterations(200);

}  // namespace
}  // namespace kvserve::worker

BENCHMARK_MAIN();
