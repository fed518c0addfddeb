// Kernel launches per decode step of the CUDA engine, counted by the emulated runtime (kernels
// and cuBLAS GEMMs; built with KVSERVE_CUDA=EMULATED only, label gpu). At small batches a
// decode step's kernels are short, so each launch costs a noticeable share of the step. The
// count per layer is the difference between a two-layer and a one-layer model of one shape.
// With CUDA graphs (--cuda-graph-max-batch), a decode step replays the whole model as one
// launch, whatever its depth.
#include <map>
#include <string>

#include "gtest/gtest.h"
#include "tests/testing/cuda_emulator/streams.h"
#include "tests/testing/paths.h"
#include "tests/testing/status_matchers.h"
#include "tests/worker/engine_test_util.h"
#include "tools/random_model.h"

namespace kvserve::worker {
namespace {

// A decode step to count: the model's depth and weights, CUDA graphs, tensor parallelism, the
// prompt's length and the attention kernel.
struct StepCase {
  int layers = 1;
  std::string dtype = "bfloat16";
  int graph_max_batch = 0;
  int tp = 1;
  int prompt = 20;
  AttentionKernel attention = AttentionKernel::kSimt;
  bool penalties = false;  // a presence penalty: the logits adjustments' lists go up too
  int decode_before = 0;   // decode steps before the one counted
  bool async = false;      // async scheduling (on by default on CUDA; off to count one step)
  bool time_ops = false;   // Backend::EnableOpTiming around the counted step
  int decode_gemv = 0;     // --decode-gemv-max-batch
};

// A decode step's kernel launches and host waits for the device (emulation::SyncCount), and
// the work still queued when Step returned (emulation::QueuedWork).
struct StepCounts {
  int64_t launches = 0;
  int64_t syncs = 0;
  int64_t queued = 0;
  std::map<std::string, kernels::Backend::OpTime> ops;  // with time_ops
};

// Launches of the first decode step of one sequence (with graphs, a replay of the graph
// recorded at start-up), summed over the tensor-parallel ranks. (The
// emulated NCCL's collectives are not counted; on a GPU each is a kernel of its own.)
StepCounts DecodeStepCounts(const StepCase& c) {
  const std::string dir = kvserve::testing::MakeTempDir() + "/model";
  RandomModelOptions o;
  o.vocab = 512;
  o.hidden = 256;
  o.layers = c.layers;
  o.heads = 4;
  o.kv_heads = 2;
  o.intermediate = 512;
  o.eos_ids = {1};
  EXPECT_OK(WriteRandomLlama(o, dir));
  EngineConfig config;
  config.model_dir = dir;
  config.backend.device = Device::kCuda;
  config.backend.attention_kernel = c.attention;
  config.dtype = *ParseWeightDtype(c.dtype);
  config.cache.num_blocks = 32;
  config.max_model_len = 512;
  config.backend.cuda_graph_max_batch = c.graph_max_batch;
  config.backend.decode_gemv_max_batch = c.decode_gemv;
  config.parallel.tensor_parallel_size = c.tp;
  config.async_scheduling = c.async ? AsyncScheduling::kOn : AsyncScheduling::kOff;
  auto engine = testing::MakeEngine(config);
  RequestInput request = testing::GreedyRequest("a", std::vector<int32_t>(c.prompt, 7), 8);
  if (c.penalties) request.sampling.presence_penalty = 0.5f;
  EXPECT_OK(engine->AddRequest(std::move(request)));
  EXPECT_OK(engine->Step().status());  // the prompt
  for (int i = 0; i < c.decode_before; ++i) EXPECT_OK(engine->Step().status());
  kernels::Backend& device = engine->runner().backend(0);
  device.EnableOpTiming(c.time_ops);
  const int64_t launches = emulation::LaunchCount(), syncs = emulation::SyncCount();
  const int64_t graph_steps = engine->stats().graph_steps;
  EXPECT_OK(engine->Step().status());
  const int64_t queued = emulation::QueuedWork();
  std::map<std::string, kernels::Backend::OpTime> ops = device.TakeOpTimes();
  // Run ahead, the step's graph is counted when it is applied: by the next step.
  if (!c.async) {
    EXPECT_EQ(engine->stats().graph_steps - graph_steps, c.graph_max_batch > 0 ? 1 : 0);
  }
  return {emulation::LaunchCount() - launches, emulation::SyncCount() - syncs, queued,
          std::move(ops)};
}

int64_t DecodeStepLaunches(const StepCase& c) { return DecodeStepCounts(c).launches; }

// Launches per layer: a two-layer model's step less a one-layer model's.
int64_t PerLayer(StepCase c) {
  c.layers = 1;
  const int64_t one = DecodeStepLaunches(c);
  c.layers = 2;
  return DecodeStepLaunches(c) - one;
}

// Per layer with 16-bit weights: RMSNorm (writing the Gemm's bf16 input), QKV Gemm, the KV write
// with RoPE fused (q rotated in place, k on its way into the cache), attention (writing bf16),
// O Gemm, RMSNorm, gate-up Gemm, SiLU·mul (writing bf16), down Gemm. Before the norms,
// attention and the activation wrote bf16 and RoPE covered q and k in one launch, it was 15;
// before RoPE went into the KV write, 10.
TEST(EngineLaunchesTest, NineKernelsPerLayerWithBf16Weights) {
  const int64_t one = DecodeStepLaunches({.layers = 1}), two = DecodeStepLaunches({.layers = 2});
  std::printf("bf16 weights: %lld launches per decode step with 1 layer, %lld with 2\n",
              static_cast<long long>(one), static_cast<long long>(two));
  EXPECT_EQ(two - one, 9);
}

// float32 weights need no rounding: the same 9.
TEST(EngineLaunchesTest, NineKernelsPerLayerWithFloat32Weights) {
  EXPECT_EQ(PerLayer({.dtype = "float32"}), 9);
}

// With DecodeGemv (--decode-gemv-max-batch) a decode step's layer is 6 launches: the QKV
// projection with its RMSNorm (and the residual add) before it, the KV write with RoPE,
// attention, the O projection, the gate-up projection with its RMSNorm before it and the
// SiLU·mul after it, the down projection (float32 weights are refused with it:
// engine_validation_test).
TEST(EngineLaunchesTest, SixKernelsPerLayerWithDecodeGemv) {
  EXPECT_EQ(PerLayer({.decode_gemv = 8}), 6);
  EXPECT_EQ(PerLayer({.dtype = "float16", .decode_gemv = 8}), 6);
  const StepCounts counts = DecodeStepCounts({.layers = 2, .time_ops = true, .decode_gemv = 8});
  const std::map<std::string, int64_t> want = {{"gemv", 8},     {"write_kv", 2},  {"attention", 2},
                                               {"rms_norm", 1}, {"embedding", 2}, {"gemm", 1},
                                               {"sample", 1},   {"logprobs", 1}};
  for (const auto& [op, t] : counts.ops) {
    EXPECT_EQ(t.count, want.contains(op) ? want.at(op) : -1) << op;
  }
  EXPECT_EQ(DecodeStepLaunches({.layers = 2, .graph_max_batch = 8, .decode_gemv = 8}), 3);
}

// A context split over several thread blocks (300 tokens: 2 splits on the emulated 132 SMs)
// needs its splits merged: by a kernel of its own after the tensor-core kernel (10 per layer),
// by the last block of each KV head inside the pipelined kernel (9, as unsplit).
TEST(EngineLaunchesTest, PipelinedAttentionMergesItsSplitsWithoutALaunch) {
  const int64_t tc = PerLayer({.prompt = 300, .attention = AttentionKernel::kTensorCores});
  const int64_t pl = PerLayer({.prompt = 300, .attention = AttentionKernel::kPipelined});
  std::printf("split decode step: %lld launches per layer (tensor cores), %lld (pipelined)\n",
              static_cast<long long>(tc), static_cast<long long>(pl));
  EXPECT_EQ(tc, 10);
  EXPECT_EQ(pl, 9);
}

// With graphs: one launch for the model (embedding to logits), one for greedy sampling and one
// for the logprobs the request asks for, at any depth.
TEST(EngineLaunchesTest, AGraphStepIsThreeLaunchesAtAnyDepth) {
  const int64_t one = DecodeStepLaunches({.layers = 1, .graph_max_batch = 8});
  const int64_t two = DecodeStepLaunches({.layers = 2, .graph_max_batch = 8});
  std::printf("with CUDA graphs: %lld launches per decode step with 1 layer, %lld with 2\n",
              static_cast<long long>(one), static_cast<long long>(two));
  EXPECT_EQ(one, 3);
  EXPECT_EQ(two, 3);
}

// With tensor parallelism each rank replays its graph (its all-reduces and the logits'
// all-gather inside), and rank 0 draws: 4 launches at TP=2, against 9 kernels per layer and
// rank (and 2 collectives per layer) eagerly.
TEST(EngineLaunchesTest, AGraphStepIsOneLaunchPerRankWithTensorParallelism) {
  const int64_t eager = DecodeStepLaunches({.layers = 2, .tp = 2});
  const int64_t graphs = DecodeStepLaunches({.layers = 2, .graph_max_batch = 8, .tp = 2});
  std::printf("TP=2, 2 layers: %lld launches per decode step eagerly, %lld with CUDA graphs\n",
              static_cast<long long>(eager), static_cast<long long>(graphs));
  EXPECT_EQ(graphs, 4);
}

// At steady state the host waits for the device once a decode step: to read the drawn tokens
// back. The batch, the logits adjustments' lists and the graph's inputs go up through pinned
// staging (kernels/cuda/staged_uploads.h) without a wait; before it, each upload waited (3 a
// step with a penalty eagerly). (The first decode step also grows the adjustments' buffer,
// and an allocation waits: counted from the third step.)
TEST(EngineLaunchesTest, ADecodeStepWaitsForTheDeviceOnlyToReadItsTokens) {
  const StepCounts eager = DecodeStepCounts({.layers = 2, .penalties = true, .decode_before = 2});
  const StepCounts graphs =
      DecodeStepCounts({.layers = 2, .graph_max_batch = 8, .penalties = true, .decode_before = 2});
  std::printf("host waits per decode step: %lld eagerly, %lld with CUDA graphs\n",
              static_cast<long long>(eager.syncs), static_cast<long long>(graphs.syncs));
  EXPECT_EQ(eager.syncs, 1);
  EXPECT_EQ(graphs.syncs, 1);
}

// Async scheduling: a decode step is queued before the host waits, and the wait is for the
// step before; when Step returns the device still has the whole step to run (emulation's
// queued work), where in series it has nothing. The one launch it adds is the gather of the
// previous step's tokens into this step's inputs.
TEST(EngineLaunchesTest, RunAheadTheDeviceStillHasTheStepWhenStepReturns) {
  for (const int graphs : {0, 8}) {
    SCOPED_TRACE(graphs > 0 ? "graphs" : "eager");
    const StepCounts serial =
        DecodeStepCounts({.layers = 2, .graph_max_batch = graphs, .decode_before = 2});
    const StepCounts ahead = DecodeStepCounts(
        {.layers = 2, .graph_max_batch = graphs, .decode_before = 2, .async = true});
    std::printf(
        "%s: in series %lld launches, %lld waits, %lld queued after Step; ahead %lld, "
        "%lld, %lld\n",
        graphs > 0 ? "graphs" : "eager", static_cast<long long>(serial.launches),
        static_cast<long long>(serial.syncs), static_cast<long long>(serial.queued),
        static_cast<long long>(ahead.launches), static_cast<long long>(ahead.syncs),
        static_cast<long long>(ahead.queued));
    EXPECT_EQ(serial.queued, 0);
    EXPECT_GE(ahead.queued, graphs > 0 ? 3 : serial.launches);
    EXPECT_EQ(ahead.launches, serial.launches + 1);
    EXPECT_EQ(ahead.syncs, 1);
  }
}

// The per-op device times (kvserve-bench engine --op-times) account for every op of a step:
// 2 layers of bf16 weights eagerly, and a graph replay as one op.
TEST(EngineLaunchesTest, OpTimesAccountForEveryLaunch) {
  const StepCounts eager = DecodeStepCounts({.layers = 2, .time_ops = true});
  const std::map<std::string, int64_t> want = {{"gemm", 9},      {"rms_norm", 5}, {"write_kv", 2},
                                               {"attention", 2}, {"silu_mul", 2}, {"embedding", 2},
                                               {"sample", 1},    {"logprobs", 1}};
  int64_t calls = 0;
  for (const auto& [op, t] : eager.ops) {
    EXPECT_EQ(t.count, want.contains(op) ? want.at(op) : -1) << op;
    EXPECT_GE(t.ms, 0) << op;
    calls += t.count;
  }
  // One op, two launches: the LM head's gemm rounds its float input to bf16 first.
  EXPECT_EQ(calls, eager.launches - 1);
  const StepCounts graphs = DecodeStepCounts({.layers = 2, .graph_max_batch = 8, .time_ops = true});
  ASSERT_TRUE(graphs.ops.contains("graph"));
  EXPECT_EQ(graphs.ops.at("graph").count, 1);
  EXPECT_FALSE(graphs.ops.contains("gemm")) << "a replay's ops are not timed one by one";
  EXPECT_TRUE(DecodeStepCounts({.layers = 2}).ops.empty()) << "off by default";
}

}  // namespace
}  // namespace kvserve::worker
