#include <algorithm>
#include <cstdint>

#include "kernels/cuda/device/launch.cuh"
#include "kernels/cuda/ops/fingerprint.h"
#include "kernels/fingerprint.h"

namespace kvserve::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 1024;

// Word i of the bytes, little-endian, zero-padded past the end.
__device__ __forceinline__ uint64_t Word(const unsigned char* p, size_t bytes, size_t i) {
  const size_t at = i * 8;
  if (at + 8 <= bytes && (reinterpret_cast<uintptr_t>(p + at) & 7) == 0) {
    return *reinterpret_cast<const uint64_t*>(p + at);
  }
  uint64_t w = 0;
  for (size_t b = 0; b < 8 && at + b < bytes; ++b) w |= static_cast<uint64_t>(p[at + b]) << (8 * b);
  return w;
}

// Each thread sums its words' terms (grid-strided); each warp adds one total to *sum.
__global__ void FingerprintTermsKernel(const unsigned char* p, size_t bytes,
                                       unsigned long long* sum) {
  const size_t words = (bytes + 7) / 8;
  uint64_t local = 0;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < words;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    local += FingerprintTerm(Word(p, bytes, i), i);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) local += __shfl_xor_sync(0xffffffffu, local, o);
  if (threadIdx.x % 32 == 0) atomicAdd(sum, static_cast<unsigned long long>(local));
}

}  // namespace

void LaunchFingerprintTerms(const void* data, size_t bytes, unsigned long long* sum,
                            cudaStream_t stream) {
  if (bytes == 0) return;
  const size_t words = (bytes + 7) / 8;
  const size_t blocks = std::min<size_t>(kMaxBlocks, (words + kThreads - 1) / kThreads);
  LaunchKernel(FingerprintTermsKernel, static_cast<unsigned>(blocks), kThreads, 0, stream,
               static_cast<const unsigned char*>(data), bytes, sum);
}

}  // namespace kvserve::kernels::cuda
