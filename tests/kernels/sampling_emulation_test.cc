// The GPU sampling kernels (kernels/cuda/ops/sampling.cuh), run on the CPU by
// tests/testing/cuda_emulator/emulator.h, against the CPU twin (kernels/cpu/sampling.h): the same
// token for every request (greedy, temperature, top-k, top-p, min-p; tie-heavy rows; vocabulary
// slices; the candidates shortcut and the full-row selection), and the logprobs of the draws
// with the same top ids. The kernels are compiled as for the GPU; CUB's block collectives and
// the cooperative-groups partition are the emulation's. tests/gpu/cuda_backend_test.cc runs
// the same cases, with more requests, on a GPU.
// The emulation comes first: it redefines the CUDA keywords the kernel sources use.
// clang-format off
#include "tests/testing/cuda_emulator/emulator.h"
// clang-format on

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cuda/ops/logits_processing.cuh"
#include "kernels/cuda/ops/sampling.cuh"
#include "tests/kernels/attention_cases.h"
#include "tests/kernels/logits_cases.h"
#include "tests/kernels/sampling_cases.h"

namespace kvserve::kernels {
namespace {

TEST(SamplingEmulationTest, SampleAndLogprobsMatchTheCpuTwin) {
  const std::unique_ptr<Backend> cpu = CreateCpuBackend({.num_threads = 1});
  std::mt19937 rng(7);
  struct Run {
    SamplingCase c;
    int requests;
  };
  for (const Run& run : {Run{{3, 1, 1, false}, 8}, Run{{5, 7, 7, true}, 16},
                         Run{{8, 1000, 1000, true}, 48}, Run{{4, 32000, 32000, false}, 24},
                         Run{{2, 151936, 37984, false}, 8}, Run{{4, 1000, 256, true}, 24}}) {
    const SamplingCase& c = run.c;
    SCOPED_TRACE(c.Name());
    const std::vector<float> logits = SamplingLogits(c, rng);
    const std::vector<SampleRequest> requests = SamplingRequests(c, run.requests, rng);
    const auto n = static_cast<int>(requests.size());
    SampleParams p;
    p.logits = logits.data();
    p.num_rows = c.rows;
    p.vocab = c.vocab;
    p.shard_vocab = c.shard;
    p.requests = requests.data();
    p.num_requests = n;
    std::vector<int32_t> got(n, -1), want(n, -1);
    p.tokens = got.data();
    emulation::Launch({n, 1, 1}, cuda::sampling::kThreads, 0,
                      [&] { cuda::sampling::SampleKernel(p); });
    p.tokens = want.data();
    cpu->Sample(p);
    for (int k = 0; k < n; ++k) {
      EXPECT_EQ(got[k], want[k]) << "request " << k << " T " << requests[k].temperature << " top_k "
                                 << requests[k].top_k << " top_p " << requests[k].top_p << " min_p "
                                 << requests[k].min_p;
    }

    const std::vector<LogprobRequest> lq = LogprobRequestsFor(requests, c.vocab);
    const auto nl = static_cast<int>(lq.size());
    LogprobsParams lp;
    lp.logits = logits.data();
    lp.num_rows = c.rows;
    lp.vocab = c.vocab;
    lp.shard_vocab = c.shard;
    lp.tokens = want.data();
    lp.requests = lq.data();
    lp.num_requests = nl;
    std::vector<float> logprob(nl), want_logprob(nl), values(nl * kMaxTopLogprobs),
        want_values(nl * kMaxTopLogprobs);
    std::vector<int32_t> ids(nl * kMaxTopLogprobs, -1), want_ids(nl * kMaxTopLogprobs, -1);
    std::vector<int32_t> rank(nl, -1), want_rank(nl, -2);
    lp.logprob = logprob.data();
    lp.rank = rank.data();
    lp.top_ids = ids.data();
    lp.top_logprobs = values.data();
    emulation::Launch({nl, 1, 1}, cuda::sampling::kThreads, 0,
                      [&] { cuda::sampling::LogprobsKernel(lp); });
    lp.logprob = want_logprob.data();
    lp.rank = want_rank.data();
    lp.top_ids = want_ids.data();
    lp.top_logprobs = want_values.data();
    cpu->Logprobs(lp);
    EXPECT_LE(WorstRatio(logprob, want_logprob, 1e-5, 1e-6), 1.0) << "logprobs differ";
    EXPECT_EQ(rank, want_rank);
    for (int k = 0; k < nl; ++k) {
      for (int i = 0; i < std::min<int64_t>(lq[k].top_n, c.vocab); ++i) {
        const int at = k * kMaxTopLogprobs + i;
        EXPECT_EQ(ids[at], want_ids[at]) << "logprob request " << k << " rank " << i;
        EXPECT_NEAR(values[at], want_values[at], 1e-5) << "logprob request " << k << " rank " << i;
      }
    }
  }
}

// The logits adjustments (penalties, biases, bans, allowed ids) change the same logits, bit for
// bit, as the CPU twin, on whole rows and vocabulary slices.
TEST(SamplingEmulationTest, AdjustLogitsMatchesTheCpuTwin) {
  const std::unique_ptr<Backend> cpu = CreateCpuBackend({.num_threads = 1});
  std::mt19937 rng(5);
  for (const SamplingCase& sc :
       {SamplingCase{6, 1000, 1000, false}, SamplingCase{4, 5000, 1280, true}}) {
    SCOPED_TRACE(sc.Name());
    std::vector<float> got = SamplingLogits(sc, rng);
    std::vector<float> want = got;
    const LogitsCase c = RandomLogitsCase(sc.rows, sc.vocab, rng);
    const AdjustLogitsParams p = c.Params(got.data(), sc.rows, sc.vocab, sc.shard);
    emulation::Launch({static_cast<int>(c.rows.size()), 1, 1}, cuda::logits::kThreads, 0,
                      [&] { cuda::logits::AdjustLogitsKernel(p); });
    cpu->AdjustLogits(c.Params(want.data(), sc.rows, sc.vocab, sc.shard));
    for (size_t i = 0; i < want.size(); ++i) {
      if (std::isnan(want[i])) {
        EXPECT_TRUE(std::isnan(got[i])) << i;
      } else {
        ASSERT_EQ(got[i], want[i]) << i;
      }
    }
  }
}

}  // namespace
}  // namespace kvserve::kernels
