// Launchers of the tensor-core paged attention (the kernel: paged_attention_mma.cuh).
#include "kernels/cuda/attention/paged_attention_mma.cuh"
#include "kernels/cuda/device/cuda_check.h"
#include "kernels/cuda/device/launch.cuh"

namespace kvserve::kernels::cuda {
namespace {

using namespace attention;  // NOLINT: the kernels' shared pieces

template <KvDType DT, int HD>
void Launch(const AttnArgs& a, const AttnPlan& plan, float* tmp_out, float* tmp_ms,
            cudaStream_t stream) {
  const dim3 grid(plan.row_tiles, a.num_kv_heads * plan.num_splits, a.num_seqs);
  const size_t smem = sizeof(float) * kWarps * kMmaRows * HD;  // 32 KiB at head_dim 128
  if (plan.prefetch_k) {
    LaunchKernel(PagedAttentionMmaKernel<DT, HD, true>, grid, kThreads, smem, stream, a, plan,
                 tmp_out, tmp_ms);
  } else {
    LaunchKernel(PagedAttentionMmaKernel<DT, HD, false>, grid, kThreads, smem, stream, a, plan,
                 tmp_out, tmp_ms);
  }
}

template <KvDType DT>
void LaunchHeadDim(const AttnArgs& a, const AttnPlan& plan, float* tmp_out, float* tmp_ms,
                   cudaStream_t stream) {
  if (a.head_dim == 64) {
    Launch<DT, 64>(a, plan, tmp_out, tmp_ms, stream);
  } else {
    Launch<DT, 128>(a, plan, tmp_out, tmp_ms, stream);
  }
}

}  // namespace

bool TensorCoreAttentionCovers(const AttnArgs& a) {
  const KvDType t = a.k_layout.dtype;
  return t != KvDType::kFp32 && (a.head_dim == 64 || a.head_dim == 128);
}

void LaunchTensorCoreAttention(const AttnArgs& a, const AttnPlan& plan, float* tmp_out,
                               float* tmp_ms, cudaStream_t stream) {
  switch (a.k_layout.dtype) {
    case KvDType::kFp16:
      LaunchHeadDim<KvDType::kFp16>(a, plan, tmp_out, tmp_ms, stream);
      break;
    case KvDType::kBf16:
      LaunchHeadDim<KvDType::kBf16>(a, plan, tmp_out, tmp_ms, stream);
      break;
    case KvDType::kFp8E4M3:
      LaunchHeadDim<KvDType::kFp8E4M3>(a, plan, tmp_out, tmp_ms, stream);
      break;
    case KvDType::kInt8:
      LaunchHeadDim<KvDType::kInt8>(a, plan, tmp_out, tmp_ms, stream);
      break;
    case KvDType::kInt4:
      LaunchHeadDim<KvDType::kInt4>(a, plan, tmp_out, tmp_ms, stream);
      break;
    case KvDType::kFp32:
      CHECK(false) << "tensor-core attention does not take float32 caches";
  }
}

}  // namespace kvserve::kernels::cuda
