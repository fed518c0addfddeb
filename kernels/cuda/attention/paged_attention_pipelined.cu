// Launchers of the pipelined decode attention (the kernel: paged_attention_pipelined.cuh).
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/attention/paged_attention_pipelined.cuh"
#include "kernels/cuda/device/cuda_check.h"
#include "kernels/cuda/device/launch.cuh"

namespace kvserve::kernels::cuda {
namespace {

using namespace attention;  // NOLINT: the kernels' shared pieces

template <KvDType DT>
using DType = std::integral_constant<KvDType, DT>;
template <int HD>
using Dim = std::integral_constant<int, HD>;

// Calls f(DType<DT>, Dim<HD>) for the instantiation that serves (dtype, head_dim) (the CUDA
// build is C++17: no template lambdas).
template <typename F>
auto Dispatch(KvDType dtype, int head_dim, const F& f) {
  const auto by_dim = [&](auto dt) {
    if (head_dim == 64) return f(dt, Dim<64>{});
    if (head_dim == 128) return f(dt, Dim<128>{});
    CHECK_EQ(head_dim, 256) << "pipelined attention: head_dim";
    return f(dt, Dim<256>{});
  };
  CHECK(dtype != KvDType::kFp32) << "pipelined attention does not take float32 caches";
  switch (dtype) {
    case KvDType::kFp16:
      return by_dim(DType<KvDType::kFp16>{});
    case KvDType::kBf16:
      return by_dim(DType<KvDType::kBf16>{});
    case KvDType::kFp8E4M3:
      return by_dim(DType<KvDType::kFp8E4M3>{});
    case KvDType::kInt8:
      return by_dim(DType<KvDType::kInt8>{});
    default:
      return by_dim(DType<KvDType::kInt4>{});
  }
}

template <typename DTag, typename HTag>
using Shape = PipelineShape<DTag::value, HTag::value>;
template <typename DTag, typename HTag>
constexpr auto Kernel() {
  return &PagedAttentionPipelinedKernel<DTag::value, HTag::value>;
}

bool Aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

}  // namespace

bool PipelinedAttentionCovers(const AttnArgs& a) {
  const KvDType t = a.k_layout.dtype;
  const bool per_token = a.k_layout.granularity == KvGranularity::kPerToken &&
                         a.v_layout.granularity == KvGranularity::kPerToken;
  return (t == KvDType::kFp16 || t == KvDType::kBf16 || (IsQuantized(t) && per_token)) &&
         (a.head_dim == 64 || a.head_dim == 128 || a.head_dim == 256) && a.block_size >= 2 &&
         int64_t{a.max_query_len} * (a.num_heads / a.num_kv_heads) <= kPipelinedRows;
}

int PipelinedSharedBytes(KvDType dtype, int head_dim) {
  // red_m, red_l and the merge flag (rounded up to 16 bytes).
  constexpr int kStaticBytes = 2 * sizeof(float) * kWarps * kPipelinedRows + 16;
  return kStaticBytes + Dispatch(dtype, head_dim, [](auto dt, auto hd) {
           return Shape<decltype(dt), decltype(hd)>::kSharedBytes;
         });
}

void PreparePipelinedAttention(int max_shared_bytes) {
  for (const KvDType t :
       {KvDType::kFp16, KvDType::kBf16, KvDType::kFp8E4M3, KvDType::kInt8, KvDType::kInt4}) {
    for (const int hd : {64, 128, 256}) {
      if (PipelinedSharedBytes(t, hd) > max_shared_bytes) continue;
      Dispatch(t, hd, [](auto dt, auto h) {
        using D = decltype(dt);
        using H = decltype(h);
        KVSERVE_CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(Kernel<D, H>()),
                                                cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                Shape<D, H>::kSharedBytes));
      });
    }
  }
}

int PipelinedAttentionBlocksPerSm(KvDType dtype, int head_dim) {
  return Dispatch(dtype, head_dim, [](auto dt, auto hd) {
    using D = decltype(dt);
    using H = decltype(hd);
    int blocks = 0;
    KVSERVE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &blocks, reinterpret_cast<const void*>(Kernel<D, H>()), kThreads,
        Shape<D, H>::kSharedBytes));
    return blocks;
  });
}

void LaunchPipelinedAttention(const AttnArgs& a, const AttnPlan& plan, float* tmp_out,
                              float* tmp_ms, unsigned* split_counters, cudaStream_t stream) {
  // 16-byte copies of K / V rows and 4-byte copies of their parameters: a GPU faults on a
  // misaligned cp.async.
  CHECK(Aligned(a.k, 16) && Aligned(a.v, 16))
      << "pipelined attention: K / V caches must be 16-byte aligned";
  CHECK(!IsQuantized(a.k_layout.dtype) || (Aligned(a.k_scales, 4) && Aligned(a.v_scales, 4)))
      << "pipelined attention: K / V scales must be 4-byte aligned";
  CHECK(a.k_layout.row_bytes == RowBytes(a.k_layout.dtype, a.head_dim) &&
        a.v_layout.row_bytes == a.k_layout.row_bytes)
      << "pipelined attention: rows of " << a.k_layout.row_bytes << " bytes";
  CHECK(plan.num_splits == 1 || split_counters != nullptr)
      << "pipelined attention: a split launch needs its merge counters";
  const dim3 grid(1, a.num_kv_heads * plan.num_splits, a.num_seqs);
  Dispatch(a.k_layout.dtype, a.head_dim, [&](auto dt, auto hd) {
    using D = decltype(dt);
    using H = decltype(hd);
    LaunchKernel(Kernel<D, H>(), grid, kThreads, Shape<D, H>::kSharedBytes, stream, a, plan,
                 tmp_out, tmp_ms, split_counters);
  });
}

}  // namespace kvserve::kernels::cuda
