// Tensor-parallel costs on the CPU backend: one Gloo all-reduce of a decode step's hidden
// states (batch × hidden floats) at TP=2, and a whole decode step at TP=1 vs TP=2 for
// tiny-llama3 (3 layers: 6 all-reduces and 1 all-gather of logits per step).
#include <cstdlib>
#include <thread>

#include "benchmark/benchmark.h"
#include "glog/logging.h"
#include "kernels/cpu/gloo_communicator.h"
#include "worker/engine.h"

namespace kvserve {
namespace {

void BM_GlooAllReduce(benchmark::State& state) {
  const size_t floats = static_cast<size_t>(state.range(0));
  auto comms = kernels::CreateGlooGroup(2, absl::Seconds(30));
  CHECK(comms.ok());
  std::vector<float> a(floats, 1.0f), b(floats, 2.0f);
  // Rank 1 runs the same number of all-reduces on its own thread, in lockstep through Gloo.
  const int64_t iterations = state.max_iterations;
  std::thread peer([&] {
    for (int64_t i = 0; i < iterations; ++i)
      CHECK((*comms)[1]->AllReduceSum(b.data(), floats).ok());
  });
  for (auto _ : state) CHECK((*comms)[0]->AllReduceSum(a.data(), floats).ok());
  peer.join();
  state.SetBytesProcessed(state.iterations() * floats * sizeof(float));
}
// Decode at hidden 128: batch 1, 16, 64; and a 4096-hidden batch-16 step of a real model.
BENCHMARK(BM_GlooAllReduce)
    ->Arg(128)
    ->Arg(128 * 16)
    ->Arg(128 * 64)
    ->Arg(4096 * 16)
    ->Iterations(2000)
    ->UseRealTime();

void BM_DecodeStepTp(benchmark::State& state) {
  const int tp = static_cast<int>(state.range(0)), batch = static_cast<int>(state.range(1));
  const char* env = std::getenv("KVSERVE_FIXTURES");
  worker::EngineConfig c;
  c.model_dir = std::string(env != nullptr ? env : KVSERVE_SOURCE_DIR "/tests/fixtures/models") +
                "/tiny-llama3";
  c.max_model_len = 1024;
  c.cache.num_blocks = batch * 64 + 8;
  c.parallel.tensor_parallel_size = tp;
  c.scheduler.max_num_seqs = batch;
  auto engine = worker::Engine::Create(c);
  CHECK(engine.ok()) << engine.status();
  for (int i = 0; i < batch; ++i) {
    worker::RequestInput in;
    in.request_id = std::to_string(i);
    in.prompt.assign(128, 7 + i);
    in.max_tokens = 800;
    in.sampling.ignore_eos = true;
    CHECK((*engine)->AddRequest(in).ok());
  }
  CHECK((*engine)->Step().ok());
  for (auto _ : state) CHECK((*engine)->Step().ok());
  state.SetItemsProcessed(state.iterations() * batch);
}
BENCHMARK(BM_DecodeStepTp)
    ->Args({1, 1})
    ->Args({2, 1})
    ->Args({1, 16})
    ->Args({2, 16})
    ->Unit(benchmark::kMicrosecond)
    ->Iterations(200)
    ->UseRealTime();

}  // namespace
}  // namespace kvserve

BENCHMARK_MAIN();
