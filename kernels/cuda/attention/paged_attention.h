// Launcher of paged attention over the quantized KV cache (decode and prefill chunks alike).
//
// One thread block serves ROWS query rows of one sequence that read the same KV head (the
// query heads of a GQA group, then the group's next query tokens), so each KV row is read
// once per group, not once per query head. The context is cut into chunks of kChunkTokens
// whose logits sit in shared memory; chunks are folded with an online softmax, and the chunks
// of a sequence are split over several thread blocks (split-KV) when the batch alone does not
// fill the GPU, their partial results merged by a second kernel (by the last block to finish,
// in the pipelined decode kernel). K and V are dequantized in
// registers as they are read (every KvFormat: fp32 / fp16 / bf16 / fp8 / int8 / int4 at any
// granularity); each sequence's block table is read once per chunk into shared memory.
#ifndef KVSERVE_KERNELS_CUDA_ATTENTION_PAGED_ATTENTION_H_
#define KVSERVE_KERNELS_CUDA_ATTENTION_PAGED_ATTENTION_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/ops/kv_layout.h"

namespace kvserve::kernels {
struct PagedAttentionParams;
}  // namespace kvserve::kernels

namespace kvserve::kernels::cuda {

inline constexpr int kChunkTokens = 256;

struct AttnArgs {
  const float* q = nullptr;
  int64_t q_stride = 0;
  float* out = nullptr;
  uint16_t* out16 = nullptr;  // instead of out: bf16 (out16_bf16) or fp16
  bool out16_bf16 = true;
  const uint8_t* k = nullptr;
  const uint8_t* v = nullptr;
  const uint16_t* k_scales = nullptr;
  const uint16_t* v_scales = nullptr;
  DevKvLayout k_layout, v_layout;
  const int32_t* query_start = nullptr;
  const int32_t* query_len = nullptr;
  const int32_t* context_len = nullptr;
  const int32_t* block_tables = nullptr;
  int64_t max_blocks_per_seq = 0;
  int num_seqs = 0, num_heads = 0, num_kv_heads = 0, head_dim = 0, block_size = 0;
  int max_query_len = 0, max_context_len = 0;
  float scale = 1.0f;
};

// How a launch is cut: set by PlanPagedAttention.
struct AttnPlan {
  bool tensor_cores = false;    // the mma.sync kernel (paged_attention_mma.cu) instead of SIMT
  bool pipelined = false;       // the pipelined decode kernel (paged_attention_pipelined.cu)
  bool prefetch_k = false;      // tensor cores: each step's K loaded during the step before
  int rows_per_block = 0;       // 4 or 8 (SIMT); 16, or 64 with prefill chunks (tensor cores)
  int row_tiles = 0;            // thread blocks per (sequence, KV head, split) along the rows
  int num_splits = 1;           // split-KV factor
  int chunks_per_split = 0;     // SIMT and tensor cores: kChunkTokens-token chunks per split
  int split_tokens = 0;         // context tokens per split (a multiple of 64)
  size_t workspace_floats = 0;  // partial outputs, maxima and sums when num_splits > 1
  // Pipelined and split: the merge counters it needs (one per sequence and KV head), zero
  // before the launch and zero again after it.
  int64_t split_counters = 0;
};

// `num_sms` sizes the split; the workspace never exceeds `max_workspace_floats` (fewer splits
// are used instead). `min_blocks_per_sm` is the target of thread blocks per SM (0: default).
// `tensor_cores` picks the tensor-core kernel where it covers the cache (fp16, bf16 and the
// quantized formats at head_dim 64 or 128; float32 caches and head_dim 256 stay SIMT).
// `pipelined` picks the pipelined decode kernel where it covers the step
// (PipelinedAttentionCovers), the tensor-core kernel elsewhere; its split plan aims at one wave
// of num_sms × min_blocks_per_sm blocks (the kernel's occupancy: PipelinedAttentionBlocksPerSm;
// 2 when 0), each split at least 256 tokens, cut at 64-token tiles.
AttnPlan PlanPagedAttention(const AttnArgs& args, int num_sms, size_t max_workspace_floats,
                            int min_blocks_per_sm = 0, bool tensor_cores = false,
                            bool pipelined = false);

// The most workspace PlanPagedAttention asks for, with the same settings, for any step within
// `limits`: up to limits.num_seqs sequences of up to limits.max_context_len tokens (heads and
// head_dim as there), `max_tokens` query tokens in all, on either kernel. For reserving it up
// front.
size_t MaxPagedAttentionWorkspaceFloats(const AttnArgs& limits, int64_t max_tokens, int num_sms,
                                        size_t max_workspace_floats, int min_blocks_per_sm = 0,
                                        bool tensor_cores = false, bool pipelined = false);

// The pipelined decode kernel covers a step when every sequence's query rows of a KV head (query
// tokens × GQA group) number at most 8, head_dim is 64, 128 or 256, the cache is fp16 / bf16
// or fp8 / int8 / int4 with per-token parameters for K and V, and blocks hold 2 tokens or more.
bool PipelinedAttentionCovers(const AttnArgs& args);
// Its shared memory per block for a cache of `dtype`, static and dynamic (bytes). It runs only
// where that fits the device's opt-in limit (cudaDevAttrMaxSharedMemoryPerBlockOptin: 227 KiB
// on sm_90, 163 KiB on sm_80, 99 KiB on sm_86 / sm_89, where 16-bit head_dim 256 does not fit).
int PipelinedSharedBytes(KvDType dtype, int head_dim);
// The blocks an SM holds at once (cudaOccupancyMaxActiveBlocksPerMultiprocessor), for an
// instantiation PreparePipelinedAttention opted in.
int PipelinedAttentionBlocksPerSm(KvDType dtype, int head_dim);
// Opts the instantiations whose shared memory fits `max_shared_bytes` in to it (past the default
// 48 KiB) on the current device: once per device, before the first launch or occupancy query,
// not while capturing.
void PreparePipelinedAttention(int max_shared_bytes);

// Requires head_dim in {16, 32, 64, 128, 256}, num_heads a multiple of num_kv_heads, block_size
// dividing kChunkTokens and per-group sizes that are multiples of 8 (CheckAttentionShape).
// `workspace`: plan.workspace_floats floats; `split_counters`: plan.split_counters zeroed
// counters (the kernel leaves them zeroed: allocate and zero them once).
void LaunchPagedAttention(const AttnArgs& args, const AttnPlan& plan, float* workspace,
                          unsigned* split_counters, cudaStream_t stream);

// The kernels' arguments for backend.h's PagedAttention call `p` (the cache's layouts
// included); `p`'s pointers as they are. Defined in cuda_backend.cc.
AttnArgs MakeAttnArgs(const PagedAttentionParams& p);

// Empty when the shape is supported, else what is not.
const char* CheckAttentionShape(const AttnArgs& args);

}  // namespace kvserve::kernels::cuda

#endif  // KVSERVE_KERNELS_CUDA_ATTENTION_PAGED_ATTENTION_H_
