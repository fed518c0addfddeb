// One warp runs the tensor-core attention kernel's own mma.sync m16n8k16 (fp16 and bf16
// inputs, float accumulation) and movmatrix.m8n8.trans (paged_attention_mma.cuh) on fragments
// from memory, so that tests/gpu/mma_probe_test.cc can hold a GPU's results against PTX's
// documented fragment layouts. If the tensor-core attention ever disagrees with the CPU on a
// GPU, this says at once whether the layouts are the cause.
#ifndef KVSERVE_TESTS_GPU_MMA_PROBE_H_
#define KVSERVE_TESTS_GPU_MMA_PROBE_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace kvserve::kernels::cuda {

// Device pointers, indexed by lane.
struct MmaProbe {
  const uint32_t* a = nullptr;  // [32][4]: A fragment registers (two 16-bit values each)
  const uint32_t* b = nullptr;  // [32][2]: B fragment registers
  const float* c = nullptr;     // [32][4]: accumulators in
  float* d_f16 = nullptr;       // [32][4]: c + a·b, the 16-bit values read as fp16
  float* d_bf16 = nullptr;      // [32][4]: the same read as bf16
  const uint32_t* x = nullptr;  // [32]: one register of an 8×8 16-bit matrix
  uint32_t* x_t = nullptr;      // [32]: movmatrix.trans of x
};

void LaunchMmaProbe(const MmaProbe& p, cudaStream_t stream);

}  // namespace kvserve::kernels::cuda

#endif  // KVSERVE_TESTS_GPU_MMA_PROBE_H_
