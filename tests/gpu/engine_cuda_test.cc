// The engine on the CUDA backend (--device cuda) against transformers' reference logits and
// greedy continuations for every fixture (float32 weights and KV cache: relative error
// < 1e-4), with and without chunked prefill; the tensor-core attention kernel against the SIMT
// one on random models of head_dim 64 and 128; bf16 weights (top-1 agreement and KL against
// transformers, printed; logits against the CPU backend's bf16 twin); an int8 KV cache on the
// GPU against the same cache on the CPU; seeded sampling (top-k / top-p, n = 2, logprobs) giving
// the CPU's tokens; the KV pool sized by --gpu-memory-utilization; swap preemption with the
// copies overlapping compute. Skipped without a CUDA device. Label: gpu. CI runs it on the CPU
// too, in the KVSERVE_CUDA=EMULATED build (tests/testing/cuda_emulator).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cuda/nccl_communicator.h"  // CudaDeviceCount
#include "tests/testing/status_matchers.h"
#include "tests/worker/engine_test_util.h"
#include "tools/random_model.h"

namespace kvserve::worker {
namespace {

using testing::ExpectMatchesReference;
using testing::FixtureConfig;
using testing::LoadReference;
using testing::Reference;
using testing::Results;
using testing::RunReference;
using testing::SampleResult;

// Free device memory in bytes.
size_t FreeDeviceMemory() {
  size_t free = 0, total = 0;
  EXPECT_EQ(cudaMemGetInfo(&free, &total), cudaSuccess);
  return free;
}

// Serving allocates no device memory after start-up: every buffer a step needs was reserved
// before the KV pool was sized (the backend's split-KV workspace included). Checked where the
// device is emulated; a GPU's driver and cuBLAS may take memory of their own.
void ExpectNothingAllocatedSince(size_t free_at_start) {
#ifdef KVSERVE_CUDA_EMULATED
  EXPECT_EQ(FreeDeviceMemory(), free_at_start) << "serving allocated device memory";
#else
  std::printf("device memory allocated while serving: %lld bytes\n",
              static_cast<long long>(free_at_start) - static_cast<long long>(FreeDeviceMemory()));
#endif
}

// Prompt logits of every reference prompt through an engine with `config`.
std::vector<std::vector<float>> PromptLogits(const EngineConfig& config, const Reference& ref) {
  Results results = RunReference(config, ref);
  std::vector<std::vector<float>> out;
  for (size_t i = 0; i < ref.prompts.size(); ++i) {
    out.push_back(results[std::to_string(i)][0].prompt_logits);
  }
  return out;
}

// The largest difference between two runs' logprobs of their first `tokens` drawn tokens.
double WorstLogprobGap(const SampleResult& a, const SampleResult& b, int tokens) {
  double worst = 0.0;
  for (int k = 0; k < tokens; ++k) {
    worst = std::max<double>(worst, std::fabs(a.logprobs[k].logprob - b.logprobs[k].logprob));
  }
  return worst;
}

class EngineCudaTest : public ::testing::TestWithParam<std::tuple<std::string, int>> {
 protected:
  void SetUp() override {
    if (kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_P(EngineCudaTest, LogitsAndGreedyMatchTransformers) {
  const auto& [model, chunk] = GetParam();
  const Reference ref = LoadReference(model);
  EngineConfig config = FixtureConfig(model);
  config.backend.device = Device::kCuda;
  config.dtype = WeightDtype::kFloat32;  // auto would be bf16 on CUDA
  if (chunk > 0) config.scheduler.max_num_batched_tokens = chunk;
  Results results = RunReference(config, ref);
  ExpectMatchesReference(results, ref);
}

INSTANTIATE_TEST_SUITE_P(AllFixtures, EngineCudaTest,
                         ::testing::Combine(::testing::Values("tiny-llama3", "tiny-qwen2",
                                                              "tiny-qwen3"),
                                            ::testing::Values(0, 7)));

TEST(EngineCudaBf16Test, Bf16WeightsTrackTransformersAndTheCpuTwin) {
  if (kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  for (const char* model : {"tiny-llama3", "tiny-qwen2", "tiny-qwen3"}) {
    const Reference ref = LoadReference(model);
    EngineConfig config = FixtureConfig(model);
    config.dtype = WeightDtype::kBFloat16;
    const auto cpu = PromptLogits(config, ref);
    config.backend.device = Device::kCuda;
    config.dtype = WeightDtype::kAuto;  // bf16 for a float32 checkpoint on CUDA
    Results results = RunReference(config, ref);
    const testing::DistributionMatch m = testing::CompareDistributions(results, ref);
    double worst = 0;
    for (size_t i = 0; i < cpu.size(); ++i) {
      worst = std::max(worst,
                       testing::RelativeError(results[std::to_string(i)][0].prompt_logits, cpu[i]));
    }
    std::printf(
        "%s bf16 weights on the GPU: top-1 agreement %.4f over %ld positions, KL mean "
        "%.2e max %.2e; vs the CPU twin: relative error %.2e\n",
        model, m.top1, static_cast<long>(m.positions), m.mean_kl, m.max_kl, worst);
    EXPECT_GE(m.top1, 0.95) << model;
    EXPECT_LT(m.mean_kl, 1e-3) << model;
    EXPECT_LT(worst, 2e-2) << model;
  }
}

// --decode-gemv-max-batch 8: the decode steps' layers run through DecodeGemv (the norms and
// the SiLU·mul fused into the projections; the prompts' steps, longer than 8 tokens, through
// cuBLAS). The greedy continuations are cuBLAS's up to near-ties (the sums run in another
// order, and a value on a bf16 rounding boundary may round the other way), their logprobs
// within 2e-2. (Qwen3's per-head norms run between the projections, not inside them.)
TEST(EngineCudaBf16Test, DecodeGemvDecodesAsCublas) {
  if (kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  for (const char* model : {"tiny-llama3", "tiny-qwen2"}) {  // GQA; biases
    SCOPED_TRACE(model);
    const Reference ref = LoadReference(model);
    EngineConfig config = FixtureConfig(model);
    config.backend.device = Device::kCuda;
    config.dtype = WeightDtype::kBFloat16;
    Results cublas = RunReference(config, ref);
    config.backend.decode_gemv_max_batch = 8;
    Results gemv = RunReference(config, ref);
    for (size_t i = 0; i < ref.prompts.size(); ++i) {
      const std::string id = std::to_string(i);
      const SampleResult& want = cublas[id][0];
      const SampleResult& got = gemv[id][0];
      const auto [agreed, near_tie] = testing::GreedyAgreement(want, got.tokens, 0.02f);
      const auto differ = std::mismatch(want.tokens.begin(), want.tokens.end(), got.tokens.begin(),
                                        got.tokens.end());
      const double worst = WorstLogprobGap(want, got, agreed);
      std::printf(
          "%s prompt %zu, DecodeGemv vs cuBLAS: greedy tokens the same up to %td of %zu "
          "(checked up to %d, %s), logprobs within %.2e\n",
          model, i, differ.first - want.tokens.begin(), want.tokens.size(), agreed,
          near_tie ? "a near tie" : "the end", worst);
      EXPECT_TRUE(agreed == static_cast<int>(want.tokens.size()) || near_tie)
          << id << " diverges at " << agreed;
      EXPECT_LT(worst, 2e-2) << id;
    }
  }
}

// Seeded top-k / top-p / min-p sampling with n = 2 and logprobs for every fixture prompt on
// `device` (forked samples, which copy their shared last block before writing it), `adjusted`:
// with every logits adjustment too (penalties, logit_bias, bad words, min_tokens, allowed ids);
// checks that steps replayed graphs exactly when asked to.
Results SeededSamples(const Reference& ref, const std::string& device, int graph_max_batch,
                      bool adjusted = false) {
  EngineConfig config = FixtureConfig("tiny-llama3");
  config.backend.device = *ParseDevice(device);
  config.dtype = WeightDtype::kFloat32;
  config.backend.cuda_graph_max_batch = graph_max_batch;
  auto engine = testing::MakeEngine(config);
  // (Adjusted: the two shorter prompts, 12 tokens each, to keep the emulated run short.)
  const size_t prompts = adjusted ? 2 : ref.prompts.size();
  for (size_t i = 0; i < prompts; ++i) {
    RequestInput in = testing::GreedyRequest(std::to_string(i), ref.prompts[i], adjusted ? 12 : 24);
    in.sampling.temperature = 0.8f;
    in.sampling.top_k = 40;
    in.sampling.top_p = 0.9f;
    in.sampling.min_p = 0.01f;
    in.sampling.seed = 7 + i;
    in.sampling.n = 2;
    if (adjusted) {
      in.sampling.presence_penalty = 0.5f;
      in.sampling.frequency_penalty = 0.3f;
      in.sampling.repetition_penalty = 1.2f;
      in.sampling.logit_bias = {{5, 3.0f}, {100, -2.0f}};
      in.sampling.bad_words = {{7}, {11, 12}};
      in.sampling.min_tokens = 4;
      in.sampling.ignore_eos = false;
      if (i == 1) in.sampling.allowed_token_ids = {2, 5, 9, 40, 41, 600};
      in.sampling.prompt_logprobs = 3;  // scored on the backend, unadjusted
      if (i == 0) {  // the whole vocabulary: rows brought back (after the adjustments) and ranked
        in.sampling.logprobs = -1;
        in.sampling.prompt_logprobs = -1;
      }
    }
    EXPECT_OK(engine->AddRequest(in));
  }
  Results results = testing::RunToCompletion(*engine);
  EXPECT_EQ(engine->stats().graph_steps > 0, graph_max_batch > 0);
  EXPECT_GT(engine->stats().cow_copies, 0) << device;
  return results;
}

// The same tokens as the CPU's (n = 2 samples each), and logprobs within 1e-3.
void ExpectCpuSamples(Results& got, const Results& cpu) {
  for (const auto& [id, samples] : cpu) ASSERT_EQ(samples.size(), 2u) << id;
  testing::ExpectSameSamples(got, cpu);
}

TEST(EngineCudaSamplingTest, SeededSamplesAreTheCpus) {
  if (kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const Reference ref = LoadReference("tiny-llama3");
  Results cpu = SeededSamples(ref, "cpu", 0), gpu = SeededSamples(ref, "cuda", 0);
  ExpectCpuSamples(gpu, cpu);
}

// The same alternatives, best first (ids compared in the first 20: further down, a near tie
// may order the other way), values within 1e-3.
void ExpectSameTop(const TokenLogprobs& got, const TokenLogprobs& want, const std::string& what) {
  ASSERT_EQ(got.top.size(), want.top.size()) << what;
  for (size_t k = 0; k < got.top.size(); ++k) {
    if (k < 20) EXPECT_EQ(got.top[k].first, want.top[k].first) << what << " " << k;
    if (std::isinf(want.top[k].second)) {  // banned by the adjustments
      EXPECT_EQ(got.top[k].second, want.top[k].second) << what << " " << k;
    } else {
      EXPECT_NEAR(got.top[k].second, want.top[k].second, 1e-3) << what << " " << k;
    }
  }
}

// With penalties, biases, bans and allowed ids: the CPU's tokens too, eager and in graphs; the
// first prompt's logprobs over the whole vocabulary, generated and prompt positions.
TEST(EngineCudaSamplingTest, AdjustedSamplesAreTheCpus) {
  if (kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const Reference ref = LoadReference("tiny-llama3");
  Results cpu = SeededSamples(ref, "cpu", 0, true);
  Results gpu = SeededSamples(ref, "cuda", 0, true), graphs = SeededSamples(ref, "cuda", 16, true);
  ExpectCpuSamples(gpu, cpu);
  ExpectCpuSamples(graphs, cpu);
  for (Results* run : {&gpu, &graphs}) {
    for (int s = 0; s < 2; ++s) {
      const std::vector<TokenLogprobs>& want = cpu["0"][s].logprobs;
      const std::vector<TokenLogprobs>& got = (*run)["0"][s].logprobs;
      ASSERT_EQ(got.size(), want.size());
      ASSERT_EQ(got[0].top.size(), 1024u) << "the whole vocabulary";
      for (size_t t = 0; t < got.size(); ++t) {
        ExpectSameTop(got[t], want[t], absl::StrCat("sample ", s, " token ", t));
      }
    }
  }
  // The prompts' logprobs: the same ranks and alternatives, values within 1e-3.
  for (const auto& [id, samples] : cpu) {
    const std::vector<TokenLogprobs>& want = samples.at(0).prompt_logprobs;
    const std::vector<TokenLogprobs>& got = gpu[id][0].prompt_logprobs;
    ASSERT_EQ(got.size(), ref.prompts[std::stoi(id)].size() - 1) << id;
    ASSERT_EQ(want.size(), got.size()) << id;
    for (size_t p = 0; p < got.size(); ++p) {
      EXPECT_EQ(got[p].token, want[p].token) << id << " " << p;
      EXPECT_EQ(got[p].rank, want[p].rank) << id << " " << p;
      EXPECT_NEAR(got[p].logprob, want[p].logprob, 1e-3) << id << " " << p;
      ASSERT_EQ(got[p].top.size(), id == "0" ? 1024u : 3u) << id << " " << p;
      ExpectSameTop(got[p], want[p], absl::StrCat(id, " ", p));
    }
  }
}

// Without --num-blocks the pool takes what --gpu-memory-utilization leaves once the weights and
// the step buffers are allocated; too small a share is refused naming the flag.
TEST(EngineCudaPoolTest, PoolFillsTheGpuMemoryShare) {
  if (kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  EngineConfig config = FixtureConfig("tiny-llama3");
  config.backend.device = Device::kCuda;
  config.cache.num_blocks = 0;
  size_t free_before = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_before, &total), cudaSuccess);
  // 5% of an H200 is ~7 GiB (a million small fixture blocks); a small device (the emulated
  // build's 1 GiB) gets enough for the 256 MiB headroom and as much again for blocks.
  constexpr double kMiB = 1048576.0;
  const double size = static_cast<double>(total);
  const double share = std::max(0.05, (size - free_before + 512 * kMiB) / size);
  config.backend.gpu_memory_utilization = share;
  {
    auto engine = testing::MakeEngine(config);
    ASSERT_NE(engine, nullptr);
    size_t free_after = 0;
    ASSERT_EQ(cudaMemGetInfo(&free_after, &total), cudaSuccess);
    const double used = (size - static_cast<double>(free_after)) / size;
    std::printf("pool: %ld blocks; GPU memory in use %.4f of %.1f GiB (asked %.4f)\n",
                static_cast<long>(engine->stats().blocks_total), used, size / (1024 * kMiB), share);
    EXPECT_GT(engine->stats().blocks_total, 1000);
    EXPECT_LE(used, share);
    // The 256 MiB headroom is all that stays unused, give or take 1% of the share.
    EXPECT_GT(used, share - 256 * kMiB / size - 0.01 * share);
  }
  config.backend.gpu_memory_utilization = 0.001;
  EXPECT_THAT(Engine::Create(config).status(),
              kvserve::testing::StatusIs(absl::StatusCode::kResourceExhausted,
                                         ::testing::HasSubstr("--gpu-memory-utilization 0.001")));
}

// An explicit --num-blocks beyond the GPU's memory is refused up front, naming the flag, where a
// failed cudaMalloc would abort the process.
TEST(EngineCudaPoolTest, TooManyBlocksAreRefusedNamingTheFlag) {
  if (kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  size_t free = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free, &total), cudaSuccess);
  EngineConfig config = FixtureConfig("tiny-llama3");
  config.backend.device = Device::kCuda;
  // The fixture's blocks take several KiB each: six times the device at least.
  config.cache.num_blocks = static_cast<int>(std::min<size_t>(total / 1024, 2'000'000'000));
  EXPECT_THAT(Engine::Create(config).status(),
              kvserve::testing::StatusIs(
                  absl::StatusCode::kResourceExhausted,
                  ::testing::HasSubstr("--num-blocks " + std::to_string(config.cache.num_blocks))));
}

// Swap preemption on the GPU: block copies run on the copy stream layer by layer and the
// compute waits only where it touches a copied layer (cuda_backend.cc); greedy outputs must be
// those of an unconstrained CPU run with the same int8 cache.
TEST(EngineCudaSwapTest, SwappedSequencesContinueAsIfNeverPreempted) {
  if (kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(31);
  std::vector<RequestInput> requests;
  for (int i = 0; i < 8; ++i) {
    std::vector<int32_t> prompt(40);
    for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % 1024);
    requests.push_back(testing::GreedyRequest("r" + std::to_string(i), prompt, 24));
  }
  EngineConfig big = FixtureConfig("tiny-llama3", 256);
  big.cache.block_size = 8;
  big.max_model_len = 128;
  big.dtype = WeightDtype::kFloat32;
  big.cache.kv_quant = {.dtype = "int8", .granularity = "per_token"};
  auto reference = testing::MakeEngine(big);  // CPU, unconstrained
  for (const RequestInput& in : requests) ASSERT_OK(reference->AddRequest(in));
  Results want = testing::RunToCompletion(*reference, true);

  EngineConfig small = big;
  small.backend.device = Device::kCuda;
  small.cache.num_blocks = 32;  // the workload needs 64
  small.cache.num_host_blocks = 64;
  small.cache.enable_prefix_caching = false;
  small.scheduler.preemption_mode = PreemptionMode::kSwap;
  auto engine = testing::MakeEngine(small);
  for (const RequestInput& in : requests) ASSERT_OK(engine->AddRequest(in));
  Results got = testing::RunToCompletion(*engine, true);
  EXPECT_GT(engine->stats().swap_out_blocks, 0);
  for (const RequestInput& in : requests) {
    auto [agreed, near_tie] =
        testing::GreedyAgreement(want[in.request_id][0], got[in.request_id][0].tokens);
    EXPECT_TRUE(agreed == 24 || near_tie) << in.request_id << " diverges at " << agreed;
  }
}

// A quantized cache on the GPU is as accurate as on the CPU against transformers' float32
// logits, and the two differ by far less than the quantization error, for every dtype and
// granularity, with full-precision layers mixed in. Not bit-exact: cuBLAS sums in another
// order than OpenBLAS, so K and V differ by ~1e-7 before quantization, and a value on a
// rounding boundary takes the neighbouring code (the same effect as in tensor_parallel_test).
// Measured in emulation (KVSERVE_CUDA=EMULATED), where OpenBLAS stands in for cuBLAS: the twins
// differ by at most 0.22 of the quantization error (int8 per-group on the 300-token prompt:
// 1.3e-3 against 5.7e-3), and the GPU's error is within 0.98-1.0 of the CPU's; the bounds leave
// room for cuBLAS's other rounding. Identical codes for identical inputs are
// cuda_backend_test's check.
TEST(EngineCudaQuantTest, QuantizedCachesOnTheGpuMatchTheCpu) {
  if (kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const Reference ref = LoadReference("tiny-llama3");
  for (const KvQuantOptions& q :
       {KvQuantOptions{.dtype = "int8", .granularity = "k:per_channel,v:per_token"},
        KvQuantOptions{.dtype = "fp8_e4m3", .granularity = "per_token"},
        KvQuantOptions{.dtype = "int8",
        .granularity = "per_group",
        .group_size = 8,
        .full_precision_layers = "first:1"},
        KvQuantOptions{.dtype = "int4", .granularity = "per_channel"},
        KvQuantOptions{.dtype = "int4",
        .granularity = "per_group",
        .group_size = 8,
        .full_precision_layers = "last:1"}}) {
    const std::string name = q.dtype + "/" + q.granularity + " " + q.full_precision_layers;
    SCOPED_TRACE(name);
    EngineConfig config = FixtureConfig("tiny-llama3");
    config.cache.kv_quant = q;
    config.dtype = WeightDtype::kFloat32;
    const auto cpu = PromptLogits(config, ref);
    config.backend.device = Device::kCuda;
    const auto gpu = PromptLogits(config, ref);
    ASSERT_EQ(cpu.size(), gpu.size());
    for (size_t i = 0; i < cpu.size(); ++i) {
      const double twins = testing::RelativeError(gpu[i], cpu[i]);
      const double cpu_error = testing::RelativeError(cpu[i], ref.logits[i]);
      const double gpu_error = testing::RelativeError(gpu[i], ref.logits[i]);
      std::printf("%s cache, prompt %zu: GPU vs CPU %.2e; vs transformers: CPU %.2e, GPU %.2e\n",
                  name.c_str(), i, twins, cpu_error, gpu_error);
      EXPECT_LT(twins, 0.5 * cpu_error) << "prompt " << i;
      EXPECT_LE(gpu_error, 1.25 * cpu_error) << "prompt " << i;
    }
  }
}

// A random-weight Llama of `heads` query heads of 64 or 128 (hidden 512) over `kv_heads` in
// `dir`, vocabulary 2048, bf16 weights on the GPU; and an engine config for it that prefills in
// chunks over cached prefixes, with `cache` ("auto", "int8", ...).
EngineConfig RandomModelConfig(const std::string& dir, int heads, int kv_heads, const char* cache) {
  RandomModelOptions o;
  o.vocab = 2048;
  o.hidden = 512;
  o.heads = heads;
  o.kv_heads = kv_heads;
  o.intermediate = 1024;
  o.eos_ids = {1};
  EXPECT_OK(WriteRandomLlama(o, dir));
  EngineConfig config;
  config.model_dir = dir;
  config.backend.device = Device::kCuda;
  config.cache.num_blocks = 512;
  config.cache.kv_quant.dtype = cache;
  config.scheduler.max_num_batched_tokens = 256;  // prefill in chunks over cached prefixes
  return config;
}

// Six greedy requests of 100 to 585 random tokens of a 2048-token vocabulary (8 new tokens
// each, prompt logits returned) on `kernel`'s attention. Emulated, three of them (100, 294 and
// 585 tokens: still batched, still prefilled in chunks over cached prefixes): the CPU emulates
// every prompt position's LM head, and the six took 165 s of CI's emulated stage.
Results RunRandomPrompts(EngineConfig config, const char* kernel) {
  config.backend.attention_kernel = *ParseAttentionKernel(kernel);
  auto engine = testing::MakeEngine(config);
  std::mt19937 prompts(11);
#ifdef KVSERVE_CUDA_EMULATED
  constexpr int kSizes[] = {0, 2, 5};
#else
  constexpr int kSizes[] = {0, 1, 2, 3, 4, 5};
#endif
  for (int i : kSizes) {
    std::vector<int32_t> prompt(100 + 97 * i);
    for (int32_t& t : prompt) t = static_cast<int32_t>(prompts() % 2048);
    RequestInput in = testing::GreedyRequest(std::to_string(i), prompt, 8);
    in.return_prompt_logits = true;
    EXPECT_OK(engine->AddRequest(in));
  }
  return testing::RunToCompletion(*engine);
}

// The tensor-core attention kernel end to end (--attention-kernel tensor-cores): it covers
// head_dim 64 and 128 only, so on random-weight Llama models of those heads (the fixtures'
// heads are 16 and 32), bf16 weights, bf16 and int8 caches, prompts of a few hundred tokens in
// chunks: prompt logits and the first sampled logprobs close to the SIMT kernel's.
TEST(EngineCudaTensorCoreTest, MatchesTheSimtKernel) {
  if (kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const std::string root = ::testing::TempDir() + "/kvserve-tc-models";
  for (const auto& [heads, kv_heads] : {std::pair{4, 1}, std::pair{8, 2}}) {
    const std::string dir = root + "/" + std::to_string(512 / heads);
    for (const char* cache : {"auto", "int8"}) {
      SCOPED_TRACE(dir + " cache " + cache);
      const EngineConfig config = RandomModelConfig(dir, heads, kv_heads, cache);
      Results simt = RunRandomPrompts(config, "simt"),
              tc = RunRandomPrompts(config, "tensor-cores");
      for (auto& [id, samples] : simt) {
        const double err =
            testing::RelativeError(tc[id][0].prompt_logits, samples[0].prompt_logits);
        std::printf("tensor cores vs SIMT, %s cache %s, prompt %s: relative error %.2e\n",
                    dir.c_str(), cache, id.c_str(), err);
        EXPECT_LT(err, 2e-2) << "prompt " << id;
      }
    }
  }
}

// The pipelined decode kernel end to end (--attention-kernel pipelined: decode steps on it,
// prefill chunks on tensor cores) on a model of head_dim 64, GQA 4:1, bf16 and int8 caches: the
// greedy continuations follow the tensor-core kernel's (up to near-ties: both round to 16
// bits, differently), and so do their logprobs.
TEST(EngineCudaPipelinedTest, DecodesAsTheTensorCoreKernel) {
  if (kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const std::string dir = ::testing::TempDir() + "/kvserve-pipelined-model";
  for (const char* cache : {"auto", "int8"}) {
    SCOPED_TRACE(std::string("cache ") + cache);
    const EngineConfig config = RandomModelConfig(dir, 8, 2, cache);
    Results tc = RunRandomPrompts(config, "tensor-cores");
    Results pl = RunRandomPrompts(config, "pipelined");
    for (auto& [id, samples] : tc) {
      const SampleResult& want = samples[0];
      const SampleResult& got = pl[id][0];
      const auto [agreed, near_tie] = testing::GreedyAgreement(want, got.tokens, 0.02f);
      EXPECT_TRUE(agreed == static_cast<int>(want.tokens.size()) || near_tie)
          << id << " diverges at " << agreed;
      const double worst = WorstLogprobGap(want, got, agreed);
      std::printf(
          "pipelined vs tensor cores, cache %s, prompt %s: %d tokens agree, logprobs "
          "within %.2e\n",
          cache, id.c_str(), agreed, worst);
      EXPECT_LT(worst, 2e-2) << id;
    }
  }
}

// CUDA graphs (--cuda-graph-max-batch): decode steps replay a recorded graph per batch and
// block-table width bucket, all recorded at start-up. Against transformers for every fixture
// (the prompt steps run eagerly, the decode steps as replays), and counted: every decode step
// must be a replay.
TEST(EngineCudaGraphTest, GraphDecodeMatchesTransformers) {
  if (kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  for (const char* model : {"tiny-llama3", "tiny-qwen2", "tiny-qwen3"}) {
    SCOPED_TRACE(model);
    const Reference ref = LoadReference(model);
    EngineConfig config = FixtureConfig(model);
    config.backend.device = Device::kCuda;
    config.dtype = WeightDtype::kFloat32;
    config.backend.cuda_graph_max_batch = 8;
    auto engine = testing::MakeEngine(config);
    ASSERT_NE(engine, nullptr);
    // Batches 1, 2, 4 and 8 times widths 8 to 64 blocks (max_model_len 1024 in blocks of 16).
    const GraphRecording& g = engine->graph_recording();
    std::printf("%s: %d of %d decode graphs recorded at start-up in %.2f s, %.1f MiB\n", model,
                g.recorded, g.buckets, g.seconds, g.device_mib);
    EXPECT_EQ(g.buckets, 16);
    EXPECT_EQ(g.recorded, 16);
    const size_t free_at_start = FreeDeviceMemory();
    const int64_t decode_steps = testing::AddReferenceRequests(*engine, ref);
    Results results = testing::RunToCompletion(*engine, true);
    ExpectMatchesReference(results, ref);
    ExpectNothingAllocatedSince(free_at_start);
    const int64_t graph_steps = engine->stats().graph_steps;
    std::printf("%s: %lld of %lld steps replayed a graph\n", model,
                static_cast<long long>(graph_steps), static_cast<long long>(engine->stats().steps));
    // Every decode step replays a graph recorded at start-up: prompt logits, which outgrow the
    // buffers the graphs read, leave those to the graphs and take new ones.
    EXPECT_EQ(graph_steps, decode_steps);
  }
}

// The seeded samples above with CUDA graphs: the CPU's tokens too.
TEST(EngineCudaGraphTest, SeededSamplesAreTheCpus) {
  if (kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const Reference ref = LoadReference("tiny-llama3");
  Results cpu = SeededSamples(ref, "cpu", 0), graphs = SeededSamples(ref, "cuda", 16);
  ExpectCpuSamples(graphs, cpu);
}

// Replays against eager steps on one workload whose decode batch shrinks from 7 to 1 as
// requests finish (buckets 8, 4, 2, 1, padded) while contexts cross block-table widths (8 →
// 16 → 32 blocks of 8 tokens), with seeded sampling and logprobs; then again with swap
// preemption in a pool too small for the workload (replays wait for the swap-ins), and with bf16
// weights and an int8 cache.
// Not bit-exact: a padded batch and a bucket's context bound change cuBLAS's and split-KV's
// summation order. With float32 weights and cache that moves logprobs by ~1e-6, so tokens and
// logprobs (within 1e-4) must match. With bf16 activations and int8 codes the same ~1e-7
// differences can round a value to its neighbour (a 2^-8 or one-code step), and in emulation
// that moved logprobs by up to 4e-3 before sampling drew a different token; there the check
// is greedy decoding, agreeing up to a near tie (top-2 margin below 0.02).
TEST(EngineCudaGraphTest, ReplaysMatchEagerStepsAcrossBuckets) {
  if (kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  struct Case {
    const char* name;
    bool swap, bf16;
  };
  for (const Case& c :
       {Case{"float32", false, false}, Case{"float32, swap preemption", true, false},
        Case{"bf16 weights, int8 cache", false, true}}) {
    SCOPED_TRACE(c.name);
    std::mt19937 rng(5);
    std::vector<RequestInput> requests;
    for (int i = 0; i < 7; ++i) {
      std::vector<int32_t> prompt(20 + 17 * i);
      for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % 1024);
      RequestInput in = testing::GreedyRequest("r" + std::to_string(i), prompt, 12 + 20 * i);
      if (!c.bf16) {
        in.sampling.temperature = 0.8f;
        in.sampling.top_k = 50;
        in.sampling.seed = 100 + i;
        in.sampling.logprobs = 3;
      }
      requests.push_back(std::move(in));
    }
    EngineConfig config = FixtureConfig("tiny-llama3", 256);
    config.backend.device = Device::kCuda;
    config.cache.block_size = 8;
    config.max_model_len = 256;
    config.dtype = c.bf16 ? WeightDtype::kBFloat16 : WeightDtype::kFloat32;
    if (c.bf16)
      config.cache.kv_quant = {.dtype = "int8", .granularity = "k:per_channel,v:per_token"};
    if (c.swap) {
      config.cache.num_blocks = 48;  // the workload needs 128
      config.cache.num_host_blocks = 128;
      config.cache.enable_prefix_caching = false;
      config.scheduler.preemption_mode = PreemptionMode::kSwap;
    }
    auto run = [&](int graph_max_batch, EngineStats* stats) {
      config.backend.cuda_graph_max_batch = graph_max_batch;
      auto engine = testing::MakeEngine(config);
      const size_t free_at_start = FreeDeviceMemory();
      for (const RequestInput& in : requests) EXPECT_OK(engine->AddRequest(in));
      Results results = testing::RunToCompletion(*engine, true);
      *stats = engine->stats();
      ExpectNothingAllocatedSince(free_at_start);
      return results;
    };
    EngineStats eager_stats, graph_stats;
    Results eager = run(0, &eager_stats), graphs = run(8, &graph_stats);
    std::printf("%s: %lld of %lld steps replayed a graph, %lld blocks swapped in\n", c.name,
                static_cast<long long>(graph_stats.graph_steps),
                static_cast<long long>(graph_stats.steps),
                static_cast<long long>(graph_stats.swap_in_blocks));
    EXPECT_EQ(eager_stats.graph_steps, 0);
    EXPECT_GT(graph_stats.graph_steps, graph_stats.steps / 2);
    if (c.swap) {
      EXPECT_GT(graph_stats.swap_in_blocks, 0);
    }
    for (const RequestInput& in : requests) {
      const SampleResult& want = eager[in.request_id][0];
      const SampleResult& got = graphs[in.request_id][0];
      if (c.bf16) {
        auto [agreed, near_tie] = testing::GreedyAgreement(want, got.tokens, 0.02f);
        EXPECT_TRUE(agreed == in.max_tokens || near_tie)
            << in.request_id << " diverges at " << agreed;
        continue;
      }
      EXPECT_EQ(got.tokens, want.tokens) << in.request_id;
      ASSERT_EQ(got.logprobs.size(), want.logprobs.size()) << in.request_id;
      for (size_t k = 0; k < want.logprobs.size(); ++k) {
        EXPECT_NEAR(got.logprobs[k].logprob, want.logprobs[k].logprob, 1e-4)
            << in.request_id << " token " << k;
      }
    }
  }
}

// A GPU with little memory left after the KV pool: recording the decode graphs at start-up
// stops where the memory ends, and the engine starts anyway, with the buckets left to run
// eagerly; then it serves the fixture's requests correctly, replaying what was recorded. The
// memory is measured on an engine that records every graph (what it takes before recording,
// and what recording takes), then taken away but for `keep` of the recording's share: the
// first graph needs cuBLAS's 32 MiB graph workspace; each emulated graph holds 64 KiB of
// device memory per node (tests/testing/cuda_emulator/runtime.cc), a GPU's perhaps little enough
// to record them all. It stays taken while the engine serves, which allocates nothing. Last in
// the file: should a GPU abort here, only this test is lost.
TEST(EngineCudaGraphTest, RecordingStopsWhereDeviceMemoryEnds) {
  if (kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const Reference ref = LoadReference("tiny-llama3");
  EngineConfig config = FixtureConfig("tiny-llama3");
  config.backend.device = Device::kCuda;
  config.dtype = WeightDtype::kFloat32;
  config.backend.cuda_graph_max_batch = 8;
  size_t before_recording = 0, recording = 0;
  {
    const size_t free = FreeDeviceMemory();
    auto engine = testing::MakeEngine(config);
    ASSERT_NE(engine, nullptr);
    const GraphRecording& g = engine->graph_recording();
    ASSERT_EQ(g.recorded, 16);
    recording = static_cast<size_t>(g.device_mib * 1048576.0);
    before_recording = free - FreeDeviceMemory() - recording;
  }
  // At least the graphs' workspace. The instantiated graphs' own memory shows in
  // cudaMemGetInfo in emulation, not on a GPU (the H200 measured the workspace alone): there the
  // second case has room for the workspace and whatever the driver needs unseen.
  constexpr size_t kWorkspace = size_t{32} << 20;
  ASSERT_GE(recording, kWorkspace);
  struct Case {
    const char* name;
    size_t keep;  // of the recording's memory
  };
  for (const Case& c : {Case{"no room for the workspace", kWorkspace / 2},
                        Case{"room for half the graphs", (kWorkspace + recording) / 2}}) {
    SCOPED_TRACE(c.name);
    void* hog = nullptr;
    ASSERT_EQ(cudaMalloc(&hog, FreeDeviceMemory() - before_recording - c.keep), cudaSuccess);
    auto engine = testing::MakeEngine(config);
    ASSERT_NE(engine, nullptr);
    const GraphRecording& g = engine->graph_recording();
    const std::string& report = engine->preflight_report();
    const size_t line = report.find("CUDA graphs");
    std::printf("%s: %s\n", c.name, report.substr(line, report.find('\n', line) - line).c_str());
    if (g.recorded < g.buckets) {
      EXPECT_THAT(g.stopped, ::testing::HasSubstr("out of memory on GPU 0"));
      EXPECT_THAT(engine->preflight_report(),
                  ::testing::HasSubstr("recording stopped, the rest run eagerly: " + g.stopped));
    } else {
      EXPECT_EQ(g.stopped, "");
    }
    if (c.keep < kWorkspace) {
      EXPECT_EQ(g.recorded, 0);
      EXPECT_THAT(g.stopped, ::testing::HasSubstr("graph workspace"));
    }
#ifdef KVSERVE_CUDA_EMULATED
    if (c.keep > kWorkspace) {
      EXPECT_GT(g.recorded, 0);
      EXPECT_LT(g.recorded, g.buckets);
      EXPECT_THAT(g.stopped, ::testing::HasSubstr("instantiated graph"));
    }
#endif
    const size_t free_at_start = FreeDeviceMemory();
    const int64_t decode_steps = testing::AddReferenceRequests(*engine, ref);
    Results results = testing::RunToCompletion(*engine, true);
    ExpectMatchesReference(results, ref);
    const int64_t graph_steps = engine->stats().graph_steps;
    std::printf("%s: %lld of %lld decode steps replayed a graph\n", c.name,
                static_cast<long long>(graph_steps), static_cast<long long>(decode_steps));
    EXPECT_LE(graph_steps, decode_steps);
    if (g.recorded == 0) {
      EXPECT_EQ(graph_steps, 0);
    }
    ExpectNothingAllocatedSince(free_at_start);
    engine.reset();
    ASSERT_EQ(cudaFree(hog), cudaSuccess);
  }
}

}  // namespace
}  // namespace kvserve::worker
