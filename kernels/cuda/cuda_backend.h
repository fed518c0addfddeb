// The CUDA backend: backend.h's ops on one GPU. GEMMs go through cuBLAS (float32 weights as
// SGEMM, fp16 / bf16 weights on the tensor cores with float32 accumulation); the rest are
// kvserve's kernels (elementwise.h, kv_write.h, paged_attention.h, copy_blocks.h). Every
// pointer in the params is a device pointer (or mapped pinned host memory for a swap pool);
// ops are asynchronous on the backend's compute stream, block copies on a copy stream that
// is ordered against it with events.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<Backend> gpu, CreateCudaBackend({.device = 0}));
//
// This header includes no CUDA header.
#ifndef KVSERVE_KERNELS_CUDA_CUDA_BACKEND_H_
#define KVSERVE_KERNELS_CUDA_CUDA_BACKEND_H_

#include <cstddef>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/kv/kv_format.h"
#include "kernels/backend.h"

namespace kvserve::kernels {

struct CudaBackendOptions {
  int device = 0;
  // Upper bound of the split-KV workspace of paged attention (fewer splits beyond it).
  size_t max_attention_workspace_bytes = size_t{256} << 20;
  // Thread blocks per SM that split-KV aims for (0: the kernel's default).
  int attention_blocks_per_sm = 0;
  // Paged attention on tensor cores where that kernel covers the cache (paged_attention.h).
  // Off by default until it has passed conformance on a GPU.
  bool attention_tensor_cores = false;
  // With tensor cores: each step's K rows loaded during the step before (AttnPlan::prefetch_k).
  // Off until a GPU has timed it against the plain loop.
  bool attention_prefetch_k = false;
  // Decode steps (at most 8 query rows per KV head) on the pipelined kernel
  // (paged_attention_pipelined.cuh) where it covers the cache, the other steps on tensor cores.
  // Off until a GPU has measured it.
  bool attention_pipelined = false;
  // Steps of up to this many token rows (at most 8) with 16-bit weights run their projections
  // as DecodeGemv: the norms and the SiLU·mul fused in (ops/decode_gemv.cuh), 6 launches a
  // layer instead of 9. 0: off, the default until a GPU has timed it against cuBLAS.
  int decode_gemv_max_rows = 0;
};

// Unavailable without a usable device; the backend makes `device` current on this thread.
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const CudaBackendOptions& options);

// FailedPrecondition naming the layer and format when the device cannot hold this KV cache:
// fp8 below compute capability 8.9, per-group sizes that are not multiples of 8, or a head_dim
// or block size the attention kernel does not cover.
absl::Status CheckCudaKvSupport(const KvCacheSpec& spec, int head_dim, int block_size, int device);

// The backend's compute stream as a cudaStream_t (benchmarks record their events on it; the
// streams are non-blocking, so work on the legacy default stream is not ordered with them).
void* CudaComputeStream(Backend& backend);

}  // namespace kvserve::kernels

#endif  // KVSERVE_KERNELS_CUDA_CUDA_BACKEND_H_
