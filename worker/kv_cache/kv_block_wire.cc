#include "worker/kv_cache/kv_block_wire.h"

#include <xxhash.h>

#include <cstring>
#include <functional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace kvserve::worker {
namespace {

constexpr std::string_view kMagic = "KVBW";
constexpr std::string_view kLinkMagic = "KVBL";
constexpr uint16_t kVersion = 1;

// One layer's four byte ranges of one block: where they start in the pool and how long they are.
struct Range {
  uint8_t* at;
  int64_t bytes;
};

// Block `block`'s ranges in layer `l`: K codes, V codes, K scales, V scales (those present).
void AddLayerRanges(KvStorage& storage, int l, int block, std::vector<Range>& out) {
  const kernels::KvCacheView v = storage.View(l);
  const int64_t heads = v.num_kv_heads;
  const int64_t kd = heads * v.k_format.RowBytes(static_cast<int>(v.head_dim)) * v.block_size;
  const int64_t vd = heads * v.v_format.RowBytes(static_cast<int>(v.head_dim)) * v.block_size;
  const int64_t ks =
      heads * v.k_format.ScaleEntries(static_cast<int>(v.block_size), static_cast<int>(v.head_dim));
  const int64_t vs =
      heads * v.v_format.ScaleEntries(static_cast<int>(v.block_size), static_cast<int>(v.head_dim));
  out.push_back({v.k + block * kd, kd});
  out.push_back({v.v + block * vd, vd});
  if (ks > 0) out.push_back({reinterpret_cast<uint8_t*>(v.k_scales + block * ks), 2 * ks});
  if (vs > 0) out.push_back({reinterpret_cast<uint8_t*>(v.v_scales + block * vs), 2 * vs});
}

std::vector<Range> BlockRanges(KvStorage& storage, int block) {
  std::vector<Range> out;
  for (int l = 0; l < storage.num_layers(); ++l) AddLayerRanges(storage, l, block, out);
  return out;
}

std::string Formats(KvStorage& storage) {
  std::vector<std::string> layers;
  for (int l = 0; l < storage.num_layers(); ++l) {
    layers.push_back(
        absl::StrCat(storage.spec().k[l].Describe(), "/", storage.spec().v[l].Describe()));
  }
  return absl::StrJoin(layers, ";");
}

template <typename T>
void Put(std::string& out, T value) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));  // little-endian hosts only (x86-64, aarch64)
  out.append(bytes, sizeof(T));
}

// Reads the wire front to back; each read fails once past the end.
class Reader {
 public:
  explicit Reader(std::string_view wire) : rest_(wire) {}
  template <typename T>
  bool Get(T* value) {
    if (rest_.size() < sizeof(T)) return false;
    std::memcpy(value, rest_.data(), sizeof(T));
    rest_.remove_prefix(sizeof(T));
    return true;
  }
  bool Take(size_t n, std::string_view* out) {
    if (rest_.size() < n) return false;
    *out = rest_.substr(0, n);
    rest_.remove_prefix(n);
    return true;
  }
  [[nodiscard]] size_t left() const { return rest_.size(); }

 private:
  std::string_view rest_;
};

// The header both wires share: magic, version, reserved, count and the storage's shape.
void PutHeader(std::string& out, std::string_view magic, size_t count, KvStorage& storage) {
  const kernels::KvCacheView first = storage.View(0);
  const std::string formats = Formats(storage);
  out.append(magic);
  Put<uint16_t>(out, kVersion);
  Put<uint16_t>(out, 0);
  Put<uint32_t>(out, static_cast<uint32_t>(count));
  Put<uint32_t>(out, static_cast<uint32_t>(storage.num_layers()));
  Put<uint32_t>(out, static_cast<uint32_t>(first.num_kv_heads));
  Put<uint32_t>(out, static_cast<uint32_t>(first.block_size));
  Put<uint32_t>(out, static_cast<uint32_t>(first.head_dim));
  Put<uint16_t>(out, static_cast<uint16_t>(formats.size()));
  out.append(formats);
}

// Reads and checks the header against `storage`; returns the block count.
absl::StatusOr<uint32_t> ReadHeader(Reader& in, std::string_view magic, KvStorage& storage) {
  std::string_view got;
  uint16_t version = 0, reserved = 0, formats_size = 0;
  uint32_t count = 0, layers = 0, heads = 0, block_size = 0, head_dim = 0;
  if (!in.Take(magic.size(), &got) || got != magic) {
    return absl::InvalidArgumentError(
        absl::StrCat("not KV blocks (no \"", std::string(magic), "\" header)"));
  }
  if (!in.Get(&version) || !in.Get(&reserved) || !in.Get(&count) || !in.Get(&layers) ||
      !in.Get(&heads) || !in.Get(&block_size) || !in.Get(&head_dim) || !in.Get(&formats_size)) {
    return absl::InvalidArgumentError("KV blocks: the header is truncated");
  }
  if (version != kVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("KV blocks: wire version ", version, ", this worker reads ", kVersion));
  }
  std::string_view formats;
  if (!in.Take(formats_size, &formats)) {
    return absl::InvalidArgumentError("KV blocks: the header is truncated");
  }
  const kernels::KvCacheView own = storage.View(0);
  const auto mismatch = [](const char* what, const auto& theirs, const auto& ours) {
    return absl::FailedPreconditionError(absl::StrCat("KV blocks: the sender's ", what, " is ",
                                                      theirs, ", this worker's is ", ours));
  };
  if (layers != static_cast<uint32_t>(storage.num_layers())) {
    return mismatch("layer count", layers, storage.num_layers());
  }
  if (heads != own.num_kv_heads) return mismatch("KV heads (per rank)", heads, own.num_kv_heads);
  if (block_size != own.block_size) return mismatch("block size", block_size, own.block_size);
  if (head_dim != own.head_dim) return mismatch("head size", head_dim, own.head_dim);
  if (const std::string ours = Formats(storage); formats != ours) {
    return mismatch("KV formats", std::string(formats), ours);
  }
  return count;
}

}  // namespace

int64_t WireBlockBytes(KvStorage& storage) {
  int64_t total = 0;
  for (const Range& r : BlockRanges(storage, 0)) total += r.bytes;
  return total;
}

namespace {

// Reads `bytes` of pool memory at `from` into `to`: through a backend, or directly.
using ReadFn = std::function<void(void* to, const void* from, size_t bytes)>;

absl::StatusOr<std::string> Encode(KvStorage& storage, const ReadFn& read,
                                   absl::Span<const int> blocks,
                                   absl::Span<const BlockHash> hashes) {
  if (blocks.size() != hashes.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(blocks.size(), " blocks and ", hashes.size(), " hashes"));
  }
  const int64_t block_bytes = WireBlockBytes(storage);
  std::string out;
  out.reserve(64 + blocks.size() * (16 + block_bytes + 8));
  PutHeader(out, kMagic, blocks.size(), storage);
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (blocks[i] < 0 || blocks[i] >= storage.num_blocks()) {
      return absl::InvalidArgumentError(
          absl::StrCat("block ", blocks[i], " is outside the pool of ", storage.num_blocks()));
    }
    const size_t start = out.size();
    out.append(hashes[i].ToBytes());
    for (const Range& r : BlockRanges(storage, blocks[i])) {
      const size_t at = out.size();
      out.resize(at + r.bytes);
      read(out.data() + at, r.at, r.bytes);
    }
    Put<uint64_t>(out, XXH3_64bits(out.data() + start, out.size() - start));
  }
  return out;
}

}  // namespace

absl::StatusOr<std::string> EncodeBlocks(KvStorage& storage, kernels::Backend& backend,
                                         absl::Span<const int> blocks,
                                         absl::Span<const BlockHash> hashes) {
  return Encode(
      storage,
      [&backend](void* to, const void* from, size_t bytes) { backend.Download(to, from, bytes); },
      blocks, hashes);
}

absl::StatusOr<std::string> EncodeHostBlocks(KvStorage& host_storage, absl::Span<const int> blocks,
                                             absl::Span<const BlockHash> hashes) {
  return Encode(
      host_storage, [](void* to, const void* from, size_t bytes) { std::memcpy(to, from, bytes); },
      blocks, hashes);
}

absl::StatusOr<std::vector<WireBlock>> ReadBlocks(std::string_view wire, KvStorage& storage) {
  Reader in(wire);
  ASSIGN_OR_RETURN(const uint32_t count, ReadHeader(in, kMagic, storage));
  const int64_t block_bytes = WireBlockBytes(storage);
  if (in.left() != count * static_cast<size_t>(16 + block_bytes + 8)) {
    return absl::InvalidArgumentError(absl::StrCat("KV blocks: ", in.left(),
                                                   " bytes of blocks for ", count, " blocks of ",
                                                   16 + block_bytes + 8));
  }
  std::vector<WireBlock> out;
  out.reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    std::string_view record, hash;
    uint64_t sum = 0;
    in.Take(16 + block_bytes, &record);
    in.Get(&sum);
    if (XXH3_64bits(record.data(), record.size()) != sum) {
      return absl::DataLossError(
          absl::StrCat("KV blocks: block ", i, " of ", count, " fails its checksum"));
    }
    hash = record.substr(0, 16);
    absl::StatusOr<BlockHash> h = BlockHash::FromBytes(hash);
    if (!h.ok()) return h.status();
    out.push_back({*h, record.substr(16)});
  }
  return out;
}

void WriteBlock(KvStorage& storage, kernels::Backend& backend, int block, const WireBlock& b) {
  size_t at = 0;
  for (const Range& r : BlockRanges(storage, block)) {
    backend.Upload(r.at, b.bytes.data() + at, r.bytes);
    at += r.bytes;
  }
}

void WriteHostBlock(KvStorage& host_storage, int block, const WireBlock& b) {
  size_t at = 0;
  for (const Range& r : BlockRanges(host_storage, block)) {
    std::memcpy(r.at, b.bytes.data() + at, r.bytes);
    at += r.bytes;
  }
}

std::vector<kernels::ByteRange> LeadingRanges(KvStorage& storage, int blocks) {
  std::vector<kernels::ByteRange> out;
  for (const Range& r : BlockRanges(storage, 0)) {
    out.push_back({r.at, static_cast<size_t>(r.bytes) * blocks});
  }
  return out;
}

std::vector<kernels::ByteRange> LayerRanges(KvStorage& storage, int layer,
                                            absl::Span<const int> blocks) {
  std::vector<Range> ranges;
  for (int b : blocks) AddLayerRanges(storage, layer, b, ranges);
  std::vector<kernels::ByteRange> out;
  for (const Range& r : ranges) out.push_back({r.at, static_cast<size_t>(r.bytes)});
  return out;
}

std::string EncodeLinkHeader(KvStorage& storage, absl::Span<const BlockHash> hashes,
                             uint64_t fingerprint) {
  std::string out;
  PutHeader(out, kLinkMagic, hashes.size(), storage);
  for (const BlockHash& h : hashes) out.append(h.ToBytes());
  Put<uint64_t>(out, fingerprint);
  Put<uint64_t>(out, XXH3_64bits(out.data(), out.size()));
  return out;
}

absl::StatusOr<LinkHeader> ReadLinkHeader(std::string_view wire, KvStorage& storage) {
  Reader in(wire);
  ASSIGN_OR_RETURN(const uint32_t count, ReadHeader(in, kLinkMagic, storage));
  if (in.left() != count * size_t{16} + 16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV link header: ", in.left(), " bytes after the header for ", count, " block hashes"));
  }
  uint64_t sum = 0;
  std::memcpy(&sum, wire.data() + wire.size() - 8, 8);
  if (XXH3_64bits(wire.data(), wire.size() - 8) != sum) {
    return absl::DataLossError("KV link header: fails its checksum");
  }
  LinkHeader out;
  for (uint32_t i = 0; i < count; ++i) {
    std::string_view bytes;
    in.Take(16, &bytes);
    ASSIGN_OR_RETURN(BlockHash h, BlockHash::FromBytes(bytes));
    out.hashes.push_back(h);
  }
  in.Get(&out.fingerprint);
  return out;
}

}  // namespace kvserve::worker
