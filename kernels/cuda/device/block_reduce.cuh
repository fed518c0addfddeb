// A float reduced over a warp by shuffles, or over a thread block by warp shuffles and one
// float per warp in shared memory, the result in every thread (RMSNorm's sum, the split merges'
// maxima and sums). Device code; the emulator (tests/testing/cuda_emulator/emulator.h) runs it
// too.
#ifndef KVSERVE_KERNELS_CUDA_DEVICE_BLOCK_REDUCE_CUH_
#define KVSERVE_KERNELS_CUDA_DEVICE_BLOCK_REDUCE_CUH_

namespace kvserve::kernels::cuda {

// `v` combined by `op` over the warp (all 32 lanes live), the result in every lane.
template <typename Op>
__device__ __forceinline__ float WarpReduce(float v, Op op) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// `v` combined by `op` over the block (blockDim.x a multiple of 32). `scratch` holds one float
// per warp and is free again when this returns, so calls may follow one another.
template <typename Op>
__device__ __forceinline__ float BlockReduce(float v, float* scratch, Op op) {
  v = WarpReduce(v, op);
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  float r = scratch[0];
  for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w) r = op(r, scratch[w]);
  __syncthreads();
  return r;
}

__device__ __forceinline__ float BlockSum(float v, float* scratch) {
  return BlockReduce(v, scratch, [](float a, float b) { return a + b; });
}

}  // namespace kvserve::kernels::cuda

#endif  // KVSERVE_KERNELS_CUDA_DEVICE_BLOCK_REDUCE_CUH_
