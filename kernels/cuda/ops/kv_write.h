// Launcher of the KV write: each token's K and V rows quantized into its cache slot, codes
// bit-identical to the CPU reference (kernels/cpu/kv_ops.cc). Tokens whose slots fall in one
// block must be contiguous in the batch and in position order (a sequence's new tokens are);
// per-channel formats re-encode a block's earlier codes when a token widens the range, so one
// thread block walks each such run in order while runs in different blocks go in parallel.
// With RoPE fused (KvWriteArgs::q), K is rotated as it is read, never in place, so that a run's
// walk reads other tokens' K unchanged.
#ifndef KVSERVE_KERNELS_CUDA_OPS_KV_WRITE_H_
#define KVSERVE_KERNELS_CUDA_OPS_KV_WRITE_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/ops/kv_layout.h"

namespace kvserve::kernels::cuda {

struct KvWriteArgs {
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t row_stride = 0;
  const int64_t* slot_mapping = nullptr;
  int64_t num_tokens = 0;
  uint8_t* k_cache = nullptr;
  uint8_t* v_cache = nullptr;
  uint16_t* k_scales = nullptr;
  uint16_t* v_scales = nullptr;
  DevKvLayout k_layout, v_layout;
  int64_t num_kv_heads = 0, block_size = 0, head_dim = 0;
  // RoPE in the same pass (WriteKvParams::rope): K rotated as it is read, and each token's
  // q_heads query heads at q (row stride q_stride) rotated in place by the blocks of their KV
  // head (q_heads / num_kv_heads each). q null: none.
  float* q = nullptr;
  int64_t q_heads = 0, q_stride = 0;
  const int32_t* positions = nullptr;
  const float* inv_freq = nullptr;
};

void LaunchKvWrite(const KvWriteArgs& args, cudaStream_t stream);

}  // namespace kvserve::kernels::cuda

#endif  // KVSERVE_KERNELS_CUDA_OPS_KV_WRITE_H_
