// The geometry of one layer's K or V as the CUDA kernels need it, computed on the host from a
// KvFormat (in cuda_backend.cc). Plain C++ without Abseil: launchers and kernels share it.
#ifndef KVSERVE_KERNELS_CUDA_OPS_KV_LAYOUT_H_
#define KVSERVE_KERNELS_CUDA_OPS_KV_LAYOUT_H_

#include <cstdint>

#include "common/kv/kv_types.h"

namespace kvserve::kernels::cuda {

struct DevKvLayout {
  KvDType dtype = KvDType::kFp32;
  KvGranularity granularity = KvGranularity::kNone;
  int group_size = 0;
  int group_shift = 0;        // log2(group_size), per_group only (sizes are powers of two)
  int params = 0;             // fp16 values per scale group (KvFormat::scale_params)
  int64_t row_bytes = 0;      // bytes per token row of one head
  int64_t scale_entries = 0;  // fp16 entries per (block, head)
};

}  // namespace kvserve::kernels::cuda

#endif  // KVSERVE_KERNELS_CUDA_OPS_KV_LAYOUT_H_
