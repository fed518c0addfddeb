// How the KV cache stores each layer's K and V: element type (fp32, fp16, bf16, fp8 E4M3,
// int8, int4), quantization granularity (per token, per group of channels, per channel with
// the tokens of a block sharing the scales) and the exact byte cost, which the engine, the
// planner (kvserve-plan) and the metrics all take from here.
//
// Scales are fp16. int8 and fp8 are symmetric (one scale: amax / 127 or amax / 448); int4 is
// asymmetric (scale and minimum, 4-bit codes 0..15). Scales live in the same block as the
// data, so paging, prefix sharing and swapping move them together.
//
//   ASSIGN_OR_RETURN(KvCacheSpec spec, MakeKvCacheSpec(options, layers, head_dim));
//   int64_t block_bytes = spec.BytesPerBlock(kv_heads, block_size, head_dim);
#ifndef KVSERVE_COMMON_KV_KV_FORMAT_H_
#define KVSERVE_COMMON_KV_KV_FORMAT_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/kv/kv_types.h"

namespace kvserve {

std::string_view KvDTypeName(KvDType t);  // "fp32", "fp16", "bf16", "fp8_e4m3", "int8", "int4"
absl::StatusOr<KvDType> ParseKvDType(std::string_view name);  // not "auto"
std::string_view KvGranularityName(KvGranularity g);
absl::StatusOr<KvGranularity> ParseKvGranularity(std::string_view name);

// The storage of K (or V) of one layer.
struct KvFormat {
  KvDType dtype = KvDType::kFp32;
  KvGranularity granularity = KvGranularity::kNone;  // kNone unless quantized
  int group_size = 0;                                // channels per scale, per_group only

  [[nodiscard]] bool quantized() const {
    return dtype == KvDType::kFp8E4M3 || dtype == KvDType::kInt8 || dtype == KvDType::kInt4;
  }
  [[nodiscard]] int bits() const;
  // fp16 values per scale group: 2 for int4 (scale, minimum), 1 for int8/fp8, 0 unquantized.
  [[nodiscard]] int scale_params() const;
  // Bytes of one token row of one head (head_dim elements).
  [[nodiscard]] int64_t RowBytes(int head_dim) const { return int64_t{head_dim} * bits() / 8; }
  // fp16 scale entries for one (block, head).
  [[nodiscard]] int64_t ScaleEntries(int block_size, int head_dim) const;
  // Bytes for one (block, head): data plus scales.
  [[nodiscard]] int64_t BlockHeadBytes(int block_size, int head_dim) const {
    return RowBytes(head_dim) * block_size + 2 * ScaleEntries(block_size, head_dim);
  }
  // "int8/per_group:128", "fp16", ...
  [[nodiscard]] std::string Describe() const;

  friend bool operator==(const KvFormat&, const KvFormat&) = default;
};

// Per-layer formats of a whole model's cache.
struct KvCacheSpec {
  std::vector<KvFormat> k, v;  // one per layer

  [[nodiscard]] int64_t BytesPerBlock(int num_kv_heads, int block_size, int head_dim) const;
  // Exact per-token cost: BytesPerBlock / block_size (per-channel scales are shared by a
  // block's tokens, so this can be fractional).
  [[nodiscard]] double BytesPerToken(int num_kv_heads, int block_size, int head_dim) const;
  // The block-hash extra key fields: caches with different layouts never share blocks.
  [[nodiscard]] std::string CacheKeyDType() const;
  [[nodiscard]] std::string CacheKeyQuant() const;
};

struct KvQuantOptions {
  std::string dtype = "auto";  // auto | fp32 | fp16 | bf16 | fp8_e4m3 | int8 | int4
  // per_token | per_group | per_channel, or "k:per_channel,v:per_token" for K and V apart.
  std::string granularity = "per_token";
  int group_size = 128;
  // "first:1,last:4", "0,5,7" or a mix; these layers stay at the auto dtype.
  std::string full_precision_layers;
};

// `auto_dtype` is the unquantized type of the backend (fp32 on the CPU backend).
// InvalidArgument naming the flag for an unknown dtype or granularity, a group size that does
// not divide head_dim, or a layer outside [0, num_layers).
absl::StatusOr<KvCacheSpec> MakeKvCacheSpec(const KvQuantOptions& options, int num_layers,
                                            int head_dim, KvDType auto_dtype = KvDType::kFp32);

// Parses --kv-full-precision-layers into a sorted list of layer indices.
absl::StatusOr<std::vector<int>> ParseLayerList(std::string_view spec, int num_layers);

}  // namespace kvserve

#endif  // KVSERVE_COMMON_KV_KV_FORMAT_H_
