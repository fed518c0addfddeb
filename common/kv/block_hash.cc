#include "common/kv/block_hash.h"

#include <bit>
#include <cstring>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "xxhash.h"

namespace kvserve {
namespace {

void AppendU16(std::string* out, uint16_t v) {
  out->push_back(static_cast<char>(v & 0xff));
  out->push_back(static_cast<char>(v >> 8));
}

void AppendU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void StoreU64(uint8_t* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(v >> (8 * i));
}

uint64_t LoadU64(const uint8_t* in) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | in[i];
  return v;
}

absl::Status AppendString(std::string* out, std::string_view field, std::string_view value) {
  if (value.size() > 0xffff) {
    return absl::InvalidArgumentError(absl::StrCat("cache key field '", std::string(field), "' is ",
                                                   value.size(), " bytes; the limit is 65535"));
  }
  AppendU16(out, static_cast<uint16_t>(value.size()));
  out->append(value);
  return absl::OkStatus();
}

}  // namespace

std::string BlockHash::ToBytes() const {
  uint8_t bytes[16];
  StoreU64(bytes, low);
  StoreU64(bytes + 8, high);
  return std::string(reinterpret_cast<const char*>(bytes), 16);
}

std::string BlockHash::ToHex() const { return absl::BytesToHexString(ToBytes()); }

absl::StatusOr<BlockHash> BlockHash::FromBytes(std::string_view bytes) {
  if (bytes.size() != 16) {
    return absl::InvalidArgumentError(absl::StrCat("a block hash is 16 bytes, got ", bytes.size()));
  }
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  return BlockHash{LoadU64(p), LoadU64(p + 8)};
}

absl::StatusOr<std::string> CacheKey::Serialize() const {
  if (block_size == 0) return absl::InvalidArgumentError("cache key block_size must be > 0");
  if (tensor_parallel_size == 0) {
    return absl::InvalidArgumentError("cache key tensor_parallel_size must be > 0");
  }
  std::string out = "KVS1";
  absl::Status s = AppendString(&out, "model_id", model_id);
  if (s.ok()) s = AppendString(&out, "kv_cache_dtype", kv_cache_dtype);
  if (s.ok()) s = AppendString(&out, "kv_quant", kv_quant);
  if (!s.ok()) return s;
  AppendU32(&out, block_size);
  AppendU32(&out, tensor_parallel_size);
  if (s = AppendString(&out, "cache_salt", cache_salt); !s.ok()) return s;
  return out;
}

BlockHash HashBlock(const BlockHash* parent, absl::Span<const uint32_t> tokens,
                    std::string_view extra_key) {
  // The input (BLOCK_HASH.md: parent || tokens as uint32 little-endian || extra key) laid out in
  // one buffer and hashed at once: the same hash as XXH3's streaming API, whose state cost
  // three times the hash itself on 16-token blocks (request_path_bench's BM_HashIds).
  const size_t size = 16 + 4 * tokens.size() + extra_key.size();
  uint8_t on_stack[1024];
  std::vector<uint8_t> on_heap;
  uint8_t* input = on_stack;
  if (size > sizeof(on_stack)) {
    on_heap.resize(size);
    input = on_heap.data();
  }
  StoreU64(input, parent != nullptr ? parent->low : 0);
  StoreU64(input + 8, parent != nullptr ? parent->high : 0);
  uint8_t* at = input + 16;
  if constexpr (std::endian::native == std::endian::little) {
    std::memcpy(at, tokens.data(), 4 * tokens.size());
    at += 4 * tokens.size();
  } else {
    for (uint32_t t : tokens) {
      for (int i = 0; i < 4; ++i) *at++ = static_cast<uint8_t>(t >> (8 * i));
    }
  }
  if (!extra_key.empty()) std::memcpy(at, extra_key.data(), extra_key.size());
  const XXH128_hash_t h = XXH3_128bits(input, size);
  return BlockHash{h.low64, h.high64};
}

std::vector<BlockHash> HashFullBlocks(absl::Span<const uint32_t> tokens, int block_size,
                                      std::string_view extra_key) {
  CHECK_GT(block_size, 0);
  std::vector<BlockHash> out;
  out.reserve(tokens.size() / block_size);
  for (size_t start = 0; start + block_size <= tokens.size(); start += block_size) {
    out.push_back(HashBlock(out.empty() ? nullptr : &out.back(), tokens.subspan(start, block_size),
                            extra_key));
  }
  return out;
}

uint64_t StableHash64(std::string_view bytes) { return XXH3_64bits(bytes.data(), bytes.size()); }

}  // namespace kvserve
