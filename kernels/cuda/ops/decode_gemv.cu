// Launcher of the decode projection (the kernel: decode_gemv.cuh).
#include <algorithm>

#include "kernels/cuda/device/cuda_check.h"
#include "kernels/cuda/device/launch.cuh"
#include "kernels/cuda/ops/decode_gemv.cuh"
#include "kernels/cuda/ops/decode_gemv.h"

namespace kvserve::kernels::cuda {
namespace {

// Blocks per SM: without a norm enough warps to keep loads in flight; with one fewer, since
// each block reads the m input rows twice from L2 to normalize them.
constexpr int kBlocksPerSm = 4, kNormBlocksPerSm = 2;

template <typename W>
void Launch(const DecodeGemvLaunch& a, int num_sms, cudaStream_t stream) {
  const bool norm = a.norm_weight != nullptr, silu = a.silu_mul;
  const int64_t wanted = (a.n + gemv::kWarps - 1) / gemv::kWarps;
  const int64_t blocks =
      std::min<int64_t>(wanted, int64_t{num_sms} * (norm ? kNormBlocksPerSm : kBlocksPerSm));
  const size_t shared = norm ? gemv::kScratchBytes + sizeof(W) * a.m * a.k : 0;
  auto run = [&](auto kernel) { LaunchKernel(kernel, blocks, gemv::kThreads, shared, stream, a); };
  if (norm) {
    silu ? run(gemv::DecodeGemvKernel<W, true, true>) : run(gemv::DecodeGemvKernel<W, true, false>);
  } else {
    silu ? run(gemv::DecodeGemvKernel<W, false, true>)
         : run(gemv::DecodeGemvKernel<W, false, false>);
  }
}

template <typename W>
void Prepare(int max_shared_bytes) {
  for (const void* kernel :
       {reinterpret_cast<const void*>(gemv::DecodeGemvKernel<W, true, true>),
        reinterpret_cast<const void*>(gemv::DecodeGemvKernel<W, true, false>)}) {
    KVSERVE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            max_shared_bytes));
  }
}

}  // namespace

int64_t PrepareDecodeGemv(int max_shared_bytes) {
  Prepare<__nv_bfloat16>(max_shared_bytes);
  Prepare<__half>(max_shared_bytes);
  return max_shared_bytes - gemv::kScratchBytes;
}

void LaunchDecodeGemv(const DecodeGemvLaunch& p, int num_sms, cudaStream_t stream) {
  if (p.m == 0 || p.n == 0) return;
  if (p.bf16) {
    Launch<__nv_bfloat16>(p, num_sms, stream);
  } else {
    Launch<__half>(p, num_sms, stream);
  }
}

}  // namespace kvserve::kernels::cuda
