#include "kernels/cuda/attention/paged_attention_mma.cuh"
#include "kernels/cuda/device/launch.cuh"
#include "tests/gpu/mma_probe.h"

namespace kvserve::kernels::cuda {
namespace {

__global__ void MmaProbeKernel(MmaProbe p) {
  const int lane = threadIdx.x;
  uint32_t a[4];
  float d16[4], d_bf[4];
  for (int i = 0; i < 4; ++i) {
    a[i] = p.a[4 * lane + i];
    d16[i] = d_bf[i] = p.c[4 * lane + i];
  }
  attention::Mma<false>(d16, a, p.b[2 * lane], p.b[2 * lane + 1]);
  attention::Mma<true>(d_bf, a, p.b[2 * lane], p.b[2 * lane + 1]);
  for (int i = 0; i < 4; ++i) {
    p.d_f16[4 * lane + i] = d16[i];
    p.d_bf16[4 * lane + i] = d_bf[i];
  }
  p.x_t[lane] = attention::Transpose8x8(p.x[lane]);
}

}  // namespace

void LaunchMmaProbe(const MmaProbe& p, cudaStream_t stream) {
  LaunchKernel(MmaProbeKernel, 1, 32, 0, stream, p);
}

}  // namespace kvserve::kernels::cuda
