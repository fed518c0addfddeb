// CUDA graphs on the CUDA backend (part of cuda_backend_test): recorded ops replayed on new
// inputs, buffers kept when their scratch grows, and a clean error when the device has no memory
// for a graph. Skipped without a CUDA device. Label: gpu.
#include <cuda_runtime.h>

#include <cstdint>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "tests/gpu/cuda_backend_fixture.h"
#include "tests/gpu/dev_buffer.h"
#include "tests/kernels/attention_cases.h"
#include "tests/testing/status_matchers.h"

namespace kvserve::kernels {
namespace {

// A suite of its own, in the binary's last source file (tests/CMakeLists.txt), so that it runs
// last: should recording fail on a GPU, the abort costs only it (tests/gpu/run.sh also runs it
// apart).
class CudaBackendGraphTest : public CudaBackendTest {};

// A recorded graph runs nothing when recorded, then replays its ops on whatever the buffers hold
// at each replay: the same results as the ops issued one by one on those inputs.
TEST_F(CudaBackendGraphTest, GraphsReplayTheRecordedOpsOnTheInputsOfTheMoment) {
  ASSERT_TRUE(gpu_->SupportsGraphs());
  const int64_t rows = 3, hidden = 256, inter = 512;
  const std::vector<float> w = Random(2 * inter * hidden, rng_, 0.05f);
  std::vector<uint16_t> w16(w.size());
  for (size_t i = 0; i < w.size(); ++i) w16[i] = FloatToBf16(w[i]);
  const std::vector<float> weight = Random(hidden, rng_);
  Dev<float> dx(rows * hidden), dweight(weight), dgate_up(rows * 2 * inter), dact(rows * inter);
  Dev<float> want(rows * 2 * inter), want_act(rows * inter);
  Dev<uint16_t> dnorm16(rows * hidden), dw16(w16), want16(rows * hidden);
  auto ops = [&](uint16_t* norm16, float* gate_up, float* act) {
    gpu_->RmsNorm({.x = dx.get(),
                   .weight = dweight.get(),
                   .rows = rows,
                   .hidden = hidden,
                   .eps = 1e-5f,
                   .out16 = norm16,
                   .out16_type = DType::kBF16});
    gpu_->Gemm({.w = dw16.get(),
                .y = gate_up,
                .m = rows,
                .n = 2 * inter,
                .k = hidden,
                .w_type = DType::kBF16,
                .x16 = norm16});
    gpu_->SiluMul({gate_up, act, rows, inter});
  };
  ASSERT_OK(gpu_->BeginGraph());
  ops(dnorm16.get(), dgate_up.get(), dact.get());
  ASSERT_OK_AND_ASSIGN(const int64_t graph, gpu_->EndGraph());
  Sync();
  for (float v : dact.Host()) ASSERT_TRUE(std::isnan(v)) << "recording ran the ops";
  for (int round = 0; round < 2; ++round) {
    const std::vector<float> x = Random(rows * hidden, rng_);
    gpu_->Upload(dx.get(), x.data(), sizeof(float) * x.size());
    ASSERT_TRUE(gpu_->ReplayGraph(graph));
    ops(want16.get(), want.get(), want_act.get());
    Sync();
    EXPECT_EQ(dnorm16.Host(), want16.Host()) << "round " << round;
    EXPECT_LE(WorstRatio(dact.Host(), want_act.Host(), 1e-6, 1e-6), 1.0) << "round " << round;
  }
  gpu_->DropGraphs();
  EXPECT_FALSE(gpu_->ReplayGraph(graph));
}

// A graph that reads a backend scratch buffer (a Gemm rounding float x to bf16 for its weights)
// outlives that buffer's growth: the backend keeps the old buffer for the graph (device memory
// stays in use until the graphs are dropped), and the replays still compute what the op does.
TEST_F(CudaBackendGraphTest, GraphsKeepTheScratchTheyReadWhenItGrows) {
  // The rounding buffer holds m x hidden bf16 values: 2 MiB for the graph's 512 rows, then
  // 4 MiB for 1024 (sizes a GPU's stream-ordered allocator maps on their own).
  const int64_t hidden = 2048, n = 64, rows = 512, more = 1024;
  constexpr size_t kMib = size_t{1} << 20;
  const std::vector<float> w = Random(n * hidden, rng_, 0.05f);
  std::vector<uint16_t> w16(w.size());
  for (size_t i = 0; i < w.size(); ++i) w16[i] = FloatToBf16(w[i]);
  Dev<float> dx(Random(more * hidden, rng_)), dy(more * n);
  Dev<uint16_t> dw16(w16);
  auto gemm = [&](int64_t m) {
    gpu_->Gemm({dx.get(), dw16.get(), nullptr, dy.get(), m, n, hidden, DType::kBF16});
  };
  // The backend's own count: a GPU's stream-ordered pool keeps freed memory mapped, so
  // cudaMemGetInfo need not move with these buffers (it did not on the H200, 2026-12-04).
  auto used = [&] {
    Sync();
    return gpu_->ScratchBytes();
  };
  gemm(rows);  // sizes the rounding buffer
  ASSERT_OK(gpu_->BeginGraph());
  gemm(rows);
  ASSERT_OK_AND_ASSIGN(const int64_t graph, gpu_->EndGraph());
  const size_t used_before = used();
  gemm(more);  // grows it
  EXPECT_GE(used(), used_before + 4 * kMib) << "a new 4 MiB buffer, the old one kept";
  const std::vector<float> zeros(more * n, 0.0f);
  for (int round = 0; round < 2; ++round) {
    const std::vector<float> x = Random(rows * hidden, rng_);
    gpu_->Upload(dx.get(), x.data(), sizeof(float) * x.size());
    gemm(rows);  // eagerly, in the grown buffer
    const std::vector<float> want = dy.Host();
    gpu_->Upload(dy.get(), zeros.data(), sizeof(float) * zeros.size());
    ASSERT_TRUE(gpu_->ReplayGraph(graph)) << "round " << round;
    const std::vector<float> got = dy.Host();
    EXPECT_TRUE(std::equal(got.begin(), got.begin() + rows * n, want.begin())) << "round " << round;
  }
  const size_t used_with_graph = used();
  gpu_->DropGraphs();
  EXPECT_LE(used() + 2 * kMib, used_with_graph) << "dropping the graph frees the buffer it kept";
}

// Takes all the device memory it can get (down to 64 KiB pieces) until released.
class MemoryHog {
 public:
  MemoryHog() {
    size_t free = 0, total = 0;
    EXPECT_EQ(cudaMemGetInfo(&free, &total), cudaSuccess);
    for (size_t piece = free; piece >= (size_t{64} << 10);) {
      void* p = nullptr;
      if (cudaMalloc(&p, piece) == cudaSuccess) {
        taken_.push_back(p);
      } else {
        (void)cudaGetLastError();
        piece /= 2;
      }
    }
  }
  ~MemoryHog() {
    for (void* p : taken_) cudaFree(p);
  }
  MemoryHog(const MemoryHog&) = delete;
  MemoryHog& operator=(const MemoryHog&) = delete;

 private:
  std::vector<void*> taken_;
};

// Without device memory for a graph, recording fails with ResourceExhausted, not an abort: first
// for cuBLAS's graph workspace (BeginGraph), then, with the workspace in place, for the
// instantiated graph (EndGraph). The backend goes on as before: the ops run eagerly, graphs
// recorded earlier replay, and with memory back recording works again.
TEST_F(CudaBackendGraphTest, GraphsWithoutDeviceMemoryFailCleanly) {
  const int64_t rows = 4, hidden = 256, n = 320;
  const std::vector<float> w = Random(n * hidden, rng_, 0.05f);
  Dev<float> dx(Random(rows * hidden, rng_)), dw(w), dweight(Random(hidden, rng_));
  Dev<float> dh(rows * hidden), dy(rows * n);
  auto ops = [&] {
    gpu_->RmsNorm({.x = dx.get(),
                   .weight = dweight.get(),
                   .out = dh.get(),
                   .rows = rows,
                   .hidden = hidden,
                   .eps = 1e-5f});
    gpu_->Gemm({dh.get(), dw.get(), nullptr, dy.get(), rows, n, hidden, DType::kF32});
  };
  ops();
  const std::vector<float> want = dy.Host();
  const std::vector<float> nan(rows * n, std::nanf(""));
  auto poison = [&] { gpu_->Upload(dy.get(), nan.data(), sizeof(float) * nan.size()); };
  int64_t first = -1;
  {
    MemoryHog hog;
    const absl::Status begin = gpu_->BeginGraph();
    EXPECT_THAT(begin, kvserve::testing::StatusIs(absl::StatusCode::kResourceExhausted,
                                                  ::testing::HasSubstr("graph workspace")));
    if (begin.ok()) {
      ASSERT_OK(gpu_->EndGraph().status());  // ends the capture
    }
    poison();
    ops();
    EXPECT_EQ(dy.Host(), want) << "the ops run eagerly after the failure";
  }
  ASSERT_OK(gpu_->BeginGraph());
  ops();
  ASSERT_OK_AND_ASSIGN(first, gpu_->EndGraph());
  {
    MemoryHog hog;
    ASSERT_OK(gpu_->BeginGraph()) << "the workspace is in place";
    ops();
    const absl::StatusOr<int64_t> second = gpu_->EndGraph();
#ifdef KVSERVE_CUDA_EMULATED
    // An emulated graph holds 64 KiB of device memory per node; a GPU's driver may find room
    // in memory of its own.
    EXPECT_THAT(second.status(),
                kvserve::testing::StatusIs(absl::StatusCode::kResourceExhausted,
                                           ::testing::HasSubstr("instantiated graph")));
#endif
    if (!second.ok()) {
      EXPECT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted) << second.status();
    }
    poison();
    ASSERT_TRUE(gpu_->ReplayGraph(first)) << "the graph recorded before still replays";
    EXPECT_EQ(dy.Host(), want);
  }
  ASSERT_OK(gpu_->BeginGraph());
  ops();
  ASSERT_OK_AND_ASSIGN(const int64_t third, gpu_->EndGraph());
  poison();
  ASSERT_TRUE(gpu_->ReplayGraph(third));
  EXPECT_EQ(dy.Host(), want) << "recorded once memory is back";
  gpu_->DropGraphs();
}

}  // namespace
}  // namespace kvserve::kernels
