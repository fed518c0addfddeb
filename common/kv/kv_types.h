// The KV cache's element types and quantization granularities, alone so that CUDA code can
// include them without the rest of kv_format.h (which pulls in Abseil).
#ifndef KVSERVE_COMMON_KV_KV_TYPES_H_
#define KVSERVE_COMMON_KV_KV_TYPES_H_

#include <cstdint>

namespace kvserve {

enum class KvDType : uint8_t { kFp32, kFp16, kBf16, kFp8E4M3, kInt8, kInt4 };
enum class KvGranularity : uint8_t { kNone, kPerToken, kPerGroup, kPerChannel };

}  // namespace kvserve

#endif  // KVSERVE_COMMON_KV_KV_TYPES_H_
