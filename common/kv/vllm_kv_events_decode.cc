// vllm_events::Decode: a consumer's reading of vLLM-format KV-event payloads (vllm_kv_events.h).
#include <msgpack.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/kv/block_hash.h"
#include "common/kv/vllm_kv_events.h"
#include "common/status_macros.h"

namespace kvserve::vllm_events {
namespace {

using msgpack::object;
namespace mt = msgpack::type;

constexpr size_t kMaxPayload = 64 << 20;
constexpr size_t kMaxElements = 1 << 20;
constexpr size_t kMaxDepth = 8;

absl::Status Bad(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("vLLM KV event batch: ", what));
}

absl::StatusOr<std::string> Str(const object& o, absl::string_view what) {
  if (o.type != mt::STR) return Bad(absl::StrCat(what, " is not a string"));
  return std::string(o.via.str.ptr, o.via.str.size);
}

absl::StatusOr<int64_t> Int(const object& o, absl::string_view what) {
  // Past INT64_MAX (a uint64 hash) the bits are kept: callers range-check what must be small.
  if (o.type == mt::POSITIVE_INTEGER) return static_cast<int64_t>(o.via.u64);
  if (o.type == mt::NEGATIVE_INTEGER) return o.via.i64;
  return Bad(absl::StrCat(what, " is not an integer"));
}

// A block hash: an integer as it is (the bits of a uint64 past INT64_MAX kept), bytes hashed.
absl::StatusOr<int64_t> Hash(const object& o, absl::string_view what) {
  if (o.type == mt::BIN || o.type == mt::STR) {
    const char* p = o.type == mt::BIN ? o.via.bin.ptr : o.via.str.ptr;
    const uint32_t n = o.type == mt::BIN ? o.via.bin.size : o.via.str.size;
    return static_cast<int64_t>(StableHash64(std::string_view(p, n)));
  }
  return Int(o, what);
}

absl::StatusOr<std::vector<int64_t>> Hashes(const object& o, absl::string_view what) {
  if (o.type != mt::ARRAY) return Bad(absl::StrCat(what, " is not a list"));
  std::vector<int64_t> out;
  for (uint32_t i = 0; i < o.via.array.size; ++i) {
    ASSIGN_OR_RETURN(int64_t h, Hash(o.via.array.ptr[i], what));
    out.push_back(h);
  }
  return out;
}

absl::StatusOr<std::vector<int32_t>> Tokens(const object& o) {
  if (o.type != mt::ARRAY) return Bad("token_ids is not a list");
  std::vector<int32_t> out;
  for (uint32_t i = 0; i < o.via.array.size; ++i) {
    ASSIGN_OR_RETURN(int64_t t, Int(o.via.array.ptr[i], "a token id"));
    if (t < 0 || t > INT32_MAX) return Bad(absl::StrCat("token id ", t, " is out of range"));
    out.push_back(static_cast<int32_t>(t));
  }
  return out;
}

absl::StatusOr<std::string> Medium(const object* o) {
  if (o == nullptr || o->type == mt::NIL) return std::string();
  return Str(*o, "medium");
}

// The fields of one event by name (a map's keys, or an array's places), nullptr when absent.
struct Fields {
  std::string type;
  const object* block_hashes = nullptr;
  const object* parent = nullptr;
  const object* token_ids = nullptr;
  const object* block_size = nullptr;
  const object* medium = nullptr;
};

absl::StatusOr<Fields> FromMap(const object& o) {
  Fields f;
  for (uint32_t i = 0; i < o.via.map.size; ++i) {
    const msgpack::object_kv& kv = o.via.map.ptr[i];
    if (kv.key.type != mt::STR) return Bad("an event's key is not a string");
    const std::string_view key(kv.key.via.str.ptr, kv.key.via.str.size);
    if (key == "type") {
      ASSIGN_OR_RETURN(f.type, Str(kv.val, "type"));
    } else if (key == "block_hashes") {
      f.block_hashes = &kv.val;
    } else if (key == "parent_block_hash") {
      f.parent = &kv.val;
    } else if (key == "token_ids") {
      f.token_ids = &kv.val;
    } else if (key == "block_size") {
      f.block_size = &kv.val;
    } else if (key == "medium") {
      f.medium = &kv.val;
    }
  }
  return f;
}

// ["BlockStored", block_hashes, parent, token_ids, block_size, lora_id?, medium?, ...],
// ["BlockRemoved", block_hashes, medium?], ["AllBlocksCleared"].
absl::StatusOr<Fields> FromArray(const object& o) {
  const uint32_t n = o.via.array.size;
  const object* a = o.via.array.ptr;
  if (n == 0) return Bad("an event is an empty list");
  Fields f;
  ASSIGN_OR_RETURN(f.type, Str(a[0], "an event's tag"));
  auto at = [&](uint32_t i) { return i < n ? &a[i] : nullptr; };
  if (f.type == "BlockStored") {
    f.block_hashes = at(1);
    f.parent = at(2);
    f.token_ids = at(3);
    f.block_size = at(4);
    f.medium = at(6);
  } else if (f.type == "BlockRemoved") {
    f.block_hashes = at(1);
    f.medium = at(2);
  }
  return f;
}

// One event, or nullopt for a type kvserve does not know.
absl::StatusOr<std::optional<Event>> ReadEvent(const object& o) {
  Fields f;
  if (o.type == mt::MAP) {
    ASSIGN_OR_RETURN(f, FromMap(o));
  } else if (o.type == mt::ARRAY) {
    ASSIGN_OR_RETURN(f, FromArray(o));
  } else {
    return Bad("an event is neither a map nor a list");
  }
  Event e;
  if (f.type == "AllBlocksCleared") {
    e.kind = Event::Kind::kAllCleared;
    return e;
  }
  if (f.type != "BlockStored" && f.type != "BlockRemoved") return std::nullopt;
  if (f.block_hashes == nullptr) return Bad(absl::StrCat(f.type, " has no block_hashes"));
  ASSIGN_OR_RETURN(e.block_hashes, Hashes(*f.block_hashes, "block_hashes"));
  ASSIGN_OR_RETURN(e.medium, Medium(f.medium));
  if (f.type == "BlockRemoved") {
    e.kind = Event::Kind::kRemoved;
    return e;
  }
  e.kind = Event::Kind::kStored;
  if (f.token_ids == nullptr || f.block_size == nullptr) {
    return Bad("BlockStored has no token_ids or block_size");
  }
  if (f.parent != nullptr && f.parent->type != mt::NIL) {
    ASSIGN_OR_RETURN(e.parent_block_hash, Hash(*f.parent, "parent_block_hash"));
  }
  ASSIGN_OR_RETURN(e.token_ids, Tokens(*f.token_ids));
  ASSIGN_OR_RETURN(int64_t bs, Int(*f.block_size, "block_size"));
  if (bs < 1 || bs > 4096) return Bad(absl::StrCat("block_size ", bs, " is out of range"));
  e.block_size = static_cast<int>(bs);
  if (e.token_ids.size() != e.block_hashes.size() * e.block_size) {
    return Bad(absl::StrCat("BlockStored has ", e.token_ids.size(), " token ids for ",
                            e.block_hashes.size(), " blocks of ", bs));
  }
  return e;
}

}  // namespace

absl::StatusOr<Batch> Decode(std::string_view payload, int* unknown) {
  if (payload.size() > kMaxPayload) return Bad("larger than 64 MiB");
  msgpack::object_handle h;
  try {
    h = msgpack::unpack(payload.data(), payload.size(), nullptr, nullptr,
                        msgpack::unpack_limit(kMaxElements, kMaxElements, kMaxPayload, kMaxPayload,
                                              kMaxElements, kMaxDepth));
  } catch (const std::exception& e) {
    return Bad(absl::StrCat("not msgpack within limits (", e.what(), ")"));
  }
  const object& root = h.get();
  const object *ts = nullptr, *events = nullptr, *rank = nullptr;
  if (root.type == mt::ARRAY && root.via.array.size >= 2) {
    ts = &root.via.array.ptr[0];
    events = &root.via.array.ptr[1];
    if (root.via.array.size >= 3) rank = &root.via.array.ptr[2];
  } else if (root.type == mt::MAP) {
    for (uint32_t i = 0; i < root.via.map.size; ++i) {
      const msgpack::object_kv& kv = root.via.map.ptr[i];
      if (kv.key.type != mt::STR) continue;
      const std::string_view key(kv.key.via.str.ptr, kv.key.via.str.size);
      if (key == "ts") ts = &kv.val;
      if (key == "events") events = &kv.val;
      if (key == "data_parallel_rank") rank = &kv.val;
    }
  }
  if (ts == nullptr || events == nullptr) return Bad("not [ts, events, ...] nor a map of them");
  Batch b;
  if (ts->type == mt::FLOAT64 || ts->type == mt::FLOAT32) {
    b.ts = ts->via.f64;
  } else {
    ASSIGN_OR_RETURN(int64_t t, Int(*ts, "ts"));
    b.ts = static_cast<double>(t);
  }
  if (rank != nullptr && rank->type != mt::NIL) {
    ASSIGN_OR_RETURN(int64_t r, Int(*rank, "data_parallel_rank"));
    b.data_parallel_rank = static_cast<int>(r);
  }
  if (events->type != mt::ARRAY) return Bad("events is not a list");
  for (uint32_t i = 0; i < events->via.array.size; ++i) {
    ASSIGN_OR_RETURN(std::optional<Event> e, ReadEvent(events->via.array.ptr[i]));
    if (e) {
      b.events.push_back(*std::move(e));
    } else if (unknown != nullptr) {
      ++*unknown;
    }
  }
  return b;
}

}  // namespace kvserve::vllm_events
