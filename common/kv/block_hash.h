// The block-hash contract shared by the router and the workers (see BLOCK_HASH.md for the
// byte-exact specification and testdata/block_hash_vectors.json for test vectors).
//
// A KV block holds `block_size` tokens; only full blocks are hashed. Block i's hash is
//   XXH3_128(seed 0, parent(16 bytes LE, zero for block 0) || tokens as uint32 LE || extra key)
// The extra key (see CacheKey) keeps incompatible caches apart: model, KV dtype and
// quantization, block size, tensor-parallel size and the request's cache salt.
//
//   ASSIGN_OR_RETURN(std::string extra, CacheKey{.model_id = "llama3-8b", ...}.Serialize());
//   std::vector<BlockHash> hashes = HashFullBlocks(token_ids, /*block_size=*/16, extra);
//
// Pure functions; safe from any thread.
#ifndef KVSERVE_COMMON_KV_BLOCK_HASH_H_
#define KVSERVE_COMMON_KV_BLOCK_HASH_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace kvserve {

// A 128-bit block hash. `low` and `high` are the two 64-bit halves of XXH3-128's result; the
// byte form (ToBytes, ToHex, the parent input of the next block) is low then high, each
// little-endian, i.e. the 128-bit integer in little-endian order.
struct BlockHash {
  uint64_t low = 0;
  uint64_t high = 0;

  friend bool operator==(const BlockHash&, const BlockHash&) = default;
  template <typename H>
  friend H AbslHashValue(H h, const BlockHash& b) {
    return H::combine(std::move(h), b.low, b.high);
  }

  // 16 bytes, little-endian (low half first).
  [[nodiscard]] std::string ToBytes() const;
  // 32 lowercase hex digits of ToBytes().
  [[nodiscard]] std::string ToHex() const;
  // Inverse of ToBytes; InvalidArgument unless exactly 16 bytes.
  static absl::StatusOr<BlockHash> FromBytes(std::string_view bytes);
};

// What makes two caches compatible. Serialize() gives the extra key bytes:
//   "KVS1" || str(model_id) || str(kv_cache_dtype) || str(kv_quant) ||
//   u32le(block_size) || u32le(tensor_parallel_size) || str(cache_salt)
// where str(s) = u16le(len(s)) || bytes of s. Empty strings are allowed.
struct CacheKey {
  std::string model_id;
  std::string kv_cache_dtype;  // e.g. "bf16", "int8"
  std::string kv_quant;        // granularity description, e.g. "per_group:128"; "" if none
  uint32_t block_size = 16;
  uint32_t tensor_parallel_size = 1;
  std::string cache_salt;  // tenant isolation; "" when the request has none

  // InvalidArgument if a string is longer than 65535 bytes or block_size /
  // tensor_parallel_size is zero.
  [[nodiscard]] absl::StatusOr<std::string> Serialize() const;
};

// Hash of one full block given its parent's hash (nullptr for the first block).
BlockHash HashBlock(const BlockHash* parent, absl::Span<const uint32_t> tokens,
                    std::string_view extra_key);

// Hashes of the leading full blocks of `tokens` (a trailing partial block is not hashed).
// `block_size` must be positive.
std::vector<BlockHash> HashFullBlocks(absl::Span<const uint32_t> tokens, int block_size,
                                      std::string_view extra_key);

// XXH3-64 of `bytes` (seed 0): a hash that every process and replica computes the same (unlike
// absl::Hash, which is salted per process). The router's session affinity uses it.
uint64_t StableHash64(std::string_view bytes);

}  // namespace kvserve

#endif  // KVSERVE_COMMON_KV_BLOCK_HASH_H_
