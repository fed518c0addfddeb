#include "common/kv/vllm_kv_events.h"

#include <msgpack.hpp>

#include "absl/strings/str_cat.h"
#include "common/string_util.h"

namespace kvserve::vllm_events {
namespace {

using Packer = msgpack::packer<msgpack::sbuffer>;

void PackString(Packer& pk, std::string_view s) {
  pk.pack_str(static_cast<uint32_t>(s.size()));
  pk.pack_str_body(s.data(), static_cast<uint32_t>(s.size()));
}

template <typename Int>
void PackInts(Packer& pk, const std::vector<Int>& values) {
  pk.pack_array(static_cast<uint32_t>(values.size()));
  for (Int v : values) pk.pack_int64(v);
}

void PackParent(Packer& pk, const std::optional<int64_t>& parent) {
  if (parent) {
    pk.pack_int64(*parent);
  } else {
    pk.pack_nil();
  }
}

// One field of a map-encoded event: its name, then what `value` packs.
template <typename F>
void Field(Packer& pk, std::string_view name, F&& value) {
  PackString(pk, name);
  value();
}

void PackMap(Packer& pk, const Event& e) {
  switch (e.kind) {
    case Event::Kind::kStored:
      pk.pack_map(8);
      Field(pk, "type", [&] { PackString(pk, "BlockStored"); });
      Field(pk, "block_hashes", [&] { PackInts(pk, e.block_hashes); });
      Field(pk, "parent_block_hash", [&] { PackParent(pk, e.parent_block_hash); });
      Field(pk, "token_ids", [&] { PackInts(pk, e.token_ids); });
      Field(pk, "block_size", [&] { pk.pack_int64(e.block_size); });
      Field(pk, "lora_id", [&] { pk.pack_nil(); });
      Field(pk, "medium", [&] { PackString(pk, e.medium); });
      Field(pk, "lora_name", [&] { pk.pack_nil(); });
      return;
    case Event::Kind::kRemoved:
      pk.pack_map(3);
      Field(pk, "type", [&] { PackString(pk, "BlockRemoved"); });
      Field(pk, "block_hashes", [&] { PackInts(pk, e.block_hashes); });
      Field(pk, "medium", [&] { PackString(pk, e.medium); });
      return;
    case Event::Kind::kAllCleared:
      pk.pack_map(1);
      Field(pk, "type", [&] { PackString(pk, "AllBlocksCleared"); });
      return;
  }
}

void PackArray(Packer& pk, const Event& e) {
  switch (e.kind) {
    case Event::Kind::kStored:
      pk.pack_array(8);
      PackString(pk, "BlockStored");
      PackInts(pk, e.block_hashes);
      PackParent(pk, e.parent_block_hash);
      PackInts(pk, e.token_ids);
      pk.pack_int64(e.block_size);
      pk.pack_nil();  // lora_id
      PackString(pk, e.medium);
      pk.pack_nil();  // lora_name
      return;
    case Event::Kind::kRemoved:
      pk.pack_array(3);
      PackString(pk, "BlockRemoved");
      PackInts(pk, e.block_hashes);
      PackString(pk, e.medium);
      return;
    case Event::Kind::kAllCleared:
      pk.pack_array(1);
      PackString(pk, "AllBlocksCleared");
      return;
  }
}

}  // namespace

absl::StatusOr<Encoding> ParseEncoding(std::string_view name) {
  if (name == "map") return Encoding::kMap;
  if (name == "array") return Encoding::kArray;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown vLLM KV event encoding '", Sv(name),
      "': 'map' (vLLM 0.24 on: events as maps tagged by type) or 'array' (vLLM up to 0.23: "
      "tagged arrays)"));
}

std::string Encode(const Batch& batch, Encoding encoding) {
  msgpack::sbuffer buf;
  Packer pk(&buf);
  pk.pack_array(3);
  pk.pack_double(batch.ts);
  pk.pack_array(static_cast<uint32_t>(batch.events.size()));
  for (const Event& e : batch.events) {
    if (encoding == Encoding::kMap) {
      PackMap(pk, e);
    } else {
      PackArray(pk, e);
    }
  }
  pk.pack_int64(batch.data_parallel_rank);
  return std::string(buf.data(), buf.size());
}

int64_t ExternalHash(const BlockHash& hash) {
  return static_cast<int64_t>(hash.low & 0x7fff'ffff'ffff'ffffULL);
}

void AddStoredBlock(std::vector<Event>& events, const BlockHash& hash,
                    const std::optional<BlockHash>& parent, absl::Span<const int32_t> tokens,
                    int block_size, std::string_view medium) {
  const std::optional<int64_t> parent_id =
      parent ? std::optional<int64_t>(ExternalHash(*parent)) : std::nullopt;
  const bool extends = !events.empty() && events.back().kind == Event::Kind::kStored &&
                       events.back().medium == medium && events.back().block_size == block_size &&
                       parent_id && events.back().block_hashes.back() == *parent_id;
  if (!extends) {
    Event e;
    e.kind = Event::Kind::kStored;
    e.parent_block_hash = parent_id;
    e.block_size = block_size;
    e.medium = std::string(medium);
    events.push_back(std::move(e));
  }
  Event& e = events.back();
  e.block_hashes.push_back(ExternalHash(hash));
  e.token_ids.insert(e.token_ids.end(), tokens.begin(), tokens.end());
}

void AddRemovedBlock(std::vector<Event>& events, const BlockHash& hash, std::string_view medium) {
  if (events.empty() || events.back().kind != Event::Kind::kRemoved ||
      events.back().medium != medium) {
    Event e;
    e.kind = Event::Kind::kRemoved;
    e.medium = std::string(medium);
    events.push_back(std::move(e));
  }
  events.back().block_hashes.push_back(ExternalHash(hash));
}

std::string EncodeSeq(int64_t seq) {
  std::string out(8, '\0');
  uint64_t v = static_cast<uint64_t>(seq);
  for (int i = 7; i >= 0; --i, v >>= 8) out[i] = static_cast<char>(v & 0xff);
  return out;
}

int64_t DecodeSeq(std::string_view frame) {
  uint64_t v = 0;
  for (size_t i = 0; i < 8; ++i) v = (v << 8) | static_cast<uint8_t>(frame[i]);
  return static_cast<int64_t>(v);
}

}  // namespace kvserve::vllm_events
