// Kernel launches per decode step of the CUDA engine, counted by the emulated runtime (kernels
// and cuBLAS GEMMs; built with KVSERVE_CUDA=EMULATED only, label gpu). At small batches a
// decode step's kernels are short, so each launch costs a noticeable share of the step. The
// count per layer is the difference between a two-layer and a one-layer model of one shape.
// With CUDA graphs (--cuda-graph-max-batch), a decode step replays the whole model as one
// launch, whatever its depth.
#include <string>

#include "gtest/gtest.h"
#include "tests/testing/cuda_emulator/streams.h"
#include "tests/testing/paths.h"
#include "tests/testing/status_matchers.h"
#include "tests/worker/engine_test_util.h"
#include "tools/random_model.h"

namespace kvserve::worker {
namespace {

// Launches of the first decode step of one sequence (with graphs, a replay of the graph
// recorded at start-up), summed over the tensor-parallel ranks. (The
// emulated NCCL's collectives are not counted; on a GPU each is a kernel of its own.)
int64_t DecodeStepLaunches(int layers, const std::string& dtype, int graph_max_batch = 0,
                           int tp = 1) {
  const std::string dir = kvserve::testing::MakeTempDir() + "/model";
  RandomModelOptions o;
  o.vocab = 512;
  o.hidden = 256;
  o.layers = layers;
  o.heads = 4;
  o.kv_heads = 2;
  o.intermediate = 512;
  o.eos_ids = {1};
  EXPECT_OK(WriteRandomLlama(o, dir));
  EngineConfig config;
  config.model_dir = dir;
  config.backend.device = Device::kCuda;
  config.dtype = *ParseWeightDtype(dtype);
  config.cache.num_blocks = 16;
  config.max_model_len = 128;
  config.backend.cuda_graph_max_batch = graph_max_batch;
  config.parallel.tensor_parallel_size = tp;
  auto engine = testing::MakeEngine(config);
  EXPECT_OK(engine->AddRequest(testing::GreedyRequest("a", std::vector<int32_t>(20, 7), 8)));
  EXPECT_OK(engine->Step().status());  // the prompt
  const int64_t before = emulation::LaunchCount();
  const int64_t graph_steps = engine->stats().graph_steps;
  EXPECT_OK(engine->Step().status());
  EXPECT_EQ(engine->stats().graph_steps - graph_steps, graph_max_batch > 0 ? 1 : 0);
  return emulation::LaunchCount() - before;
}

// Per layer with 16-bit weights: RMSNorm (writing the Gemm's bf16 input), QKV Gemm, RoPE over q
// and k at once, KV write, attention (writing bf16), O Gemm, RMSNorm, gate-up Gemm, SiLU·mul
// (writing bf16), down Gemm. Before the norms, attention and the activation wrote bf16 and
// RoPE covered q and k in one launch, it was 15.
TEST(EngineLaunchesTest, TenKernelsPerLayerWithBf16Weights) {
  const int64_t one = DecodeStepLaunches(1, "bfloat16"), two = DecodeStepLaunches(2, "bfloat16");
  std::printf("bf16 weights: %lld launches per decode step with 1 layer, %lld with 2\n",
              static_cast<long long>(one), static_cast<long long>(two));
  EXPECT_EQ(two - one, 10);
}

// float32 weights need no rounding: the same 10.
TEST(EngineLaunchesTest, TenKernelsPerLayerWithFloat32Weights) {
  const int64_t one = DecodeStepLaunches(1, "float32"), two = DecodeStepLaunches(2, "float32");
  EXPECT_EQ(two - one, 10);
}

// With graphs: one launch for the model (embedding to logits), one for greedy sampling and one
// for the logprobs the request asks for, at any depth.
TEST(EngineLaunchesTest, AGraphStepIsThreeLaunchesAtAnyDepth) {
  const int64_t one = DecodeStepLaunches(1, "bfloat16", 8);
  const int64_t two = DecodeStepLaunches(2, "bfloat16", 8);
  std::printf("with CUDA graphs: %lld launches per decode step with 1 layer, %lld with 2\n",
              static_cast<long long>(one), static_cast<long long>(two));
  EXPECT_EQ(one, 3);
  EXPECT_EQ(two, 3);
}

// With tensor parallelism each rank replays its graph (its all-reduces and the logits'
// all-gather inside), and rank 0 draws: 4 launches at TP=2, against 10 kernels per layer and
// rank (and 2 collectives per layer) eagerly.
TEST(EngineLaunchesTest, AGraphStepIsOneLaunchPerRankWithTensorParallelism) {
  const int64_t eager = DecodeStepLaunches(2, "bfloat16", 0, 2);
  const int64_t graphs = DecodeStepLaunches(2, "bfloat16", 8, 2);
  std::printf("TP=2, 2 layers: %lld launches per decode step eagerly, %lld with CUDA graphs\n",
              static_cast<long long>(eager), static_cast<long long>(graphs));
  EXPECT_EQ(graphs, 4);
}

}  // namespace
}  // namespace kvserve::worker
