// The GPU's mma.sync m16n8k16 (fp16 and bf16) and movmatrix.m8n8.trans, as the tensor-core
// attention kernel issues them (tests/gpu/mma_probe.h), against PTX's documented fragment
// layouts (tests/kernels/ptx_fragments.h). Small integers throughout, so every product and sum
// is exact and the results must match bit for bit. Skipped without a device; in the emulated
// build it checks the emulator's stand-ins instead.
#include "tests/gpu/mma_probe.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <random>
#include <vector>

#include "common/model/dtype.h"
#include "gtest/gtest.h"
#include "kernels/cuda/nccl_communicator.h"
#include "tests/kernels/ptx_fragments.h"

namespace kvserve::kernels::cuda {
namespace {

template <typename T>
T* ToDevice(const std::vector<T>& host) {
  T* d = nullptr;
  EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), host.size() * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(d, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
            cudaSuccess);
  return d;
}

template <typename T>
std::vector<T> ToHost(const T* device, size_t n) {
  std::vector<T> host(n);
  EXPECT_EQ(cudaMemcpy(host.data(), device, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return host;
}

TEST(MmaProbeTest, InstructionsFollowPtxLayouts) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> small(-8, 8);
  // Random small integers, each register's pair kept as values and as fp16 / bf16 bits.
  ptx::Warp4 a;
  ptx::Warp2 b;
  ptx::WarpC c;
  std::vector<uint32_t> a16(32 * 4), a_bf(32 * 4), b16(32 * 2), b_bf(32 * 2);
  std::vector<float> c_in(32 * 4);
  const auto pair = [&](ptx::Pair& p, uint32_t& f16, uint32_t& bf16) {
    p = {static_cast<double>(small(rng)), static_cast<double>(small(rng))};
    f16 = FloatToF16(static_cast<float>(p[0])) |
          static_cast<uint32_t>(FloatToF16(static_cast<float>(p[1]))) << 16;
    bf16 = FloatToBf16(static_cast<float>(p[0])) |
           static_cast<uint32_t>(FloatToBf16(static_cast<float>(p[1]))) << 16;
  };
  for (int lane = 0; lane < 32; ++lane) {
    for (int r = 0; r < 4; ++r) pair(a[lane][r], a16[4 * lane + r], a_bf[4 * lane + r]);
    for (int r = 0; r < 2; ++r) pair(b[lane][r], b16[2 * lane + r], b_bf[2 * lane + r]);
    for (int e = 0; e < 4; ++e) c[lane][e] = c_in[4 * lane + e] = static_cast<float>(small(rng));
  }
  ptx::Mma(c, a, b);
  // movmatrix: distinct 16-bit values, so a misplaced one cannot pass.
  std::array<ptx::Pair, 32> x;
  std::vector<uint32_t> x_bits(32);
  for (int lane = 0; lane < 32; ++lane) {
    const uint32_t lo = 0x1000u + 2 * lane, hi = 0x1000u + 2 * lane + 1;
    x[lane] = {static_cast<double>(lo), static_cast<double>(hi)};
    x_bits[lane] = lo | hi << 16;
  }
  const std::array<ptx::Pair, 32> x_t = ptx::Transpose(x);

  for (const bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16" : "fp16");
    MmaProbe p;
    p.a = ToDevice(bf16 ? a_bf : a16);
    p.b = ToDevice(bf16 ? b_bf : b16);
    p.c = ToDevice(c_in);
    float* d_f16 = ToDevice(std::vector<float>(32 * 4, -1.0f));
    float* d_bf16 = ToDevice(std::vector<float>(32 * 4, -1.0f));
    p.d_f16 = d_f16;
    p.d_bf16 = d_bf16;
    p.x = ToDevice(x_bits);
    uint32_t* got_t = ToDevice(std::vector<uint32_t>(32, 0u));
    p.x_t = got_t;
    LaunchMmaProbe(p, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    // The kernel runs both mma kinds on the same bits; the kind whose inputs were encoded for it
    // must give the reference.
    const std::vector<float> d = ToHost(bf16 ? d_bf16 : d_f16, 32 * 4);
    for (int lane = 0; lane < 32; ++lane) {
      for (int e = 0; e < 4; ++e) {
        EXPECT_EQ(d[4 * lane + e], c[lane][e]) << "lane " << lane << " element " << e;
      }
    }
    const std::vector<uint32_t> t = ToHost(got_t, 32);
    for (int lane = 0; lane < 32; ++lane) {
      EXPECT_EQ(t[lane] & 0xffffu, static_cast<uint32_t>(x_t[lane][0])) << "lane " << lane;
      EXPECT_EQ(t[lane] >> 16, static_cast<uint32_t>(x_t[lane][1])) << "lane " << lane;
    }
    for (const void* ptr : {static_cast<const void*>(p.a), static_cast<const void*>(p.b),
                            static_cast<const void*>(p.c), static_cast<const void*>(p.x)}) {
      EXPECT_EQ(cudaFree(const_cast<void*>(ptr)), cudaSuccess);
    }
    for (void* ptr :
         {static_cast<void*>(d_f16), static_cast<void*>(d_bf16), static_cast<void*>(got_t)}) {
      EXPECT_EQ(cudaFree(ptr), cudaSuccess);
    }
  }
}

}  // namespace
}  // namespace kvserve::kernels::cuda
