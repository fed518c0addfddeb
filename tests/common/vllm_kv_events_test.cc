// vLLM-format KV events (common/kv/vllm_kv_events.h): each encoding decoded back with msgpack-c and
// checked field by field against vLLM's definitions (vllm/distributed/kv_events.py: the
// tagged arrays up to 0.23 and the maps of 0.24 on tagged by "type", in a [ts, events,
// data_parallel_rank] batch); chains of stored blocks merge into one event as vLLM sends them;
// hashes are non-negative 64-bit integers. Decode reads what every vLLM version has sent, written
// by an independent encoder (@msgpack/msgpack: the fuzzer's seeds in
// tests/fuzz/corpus/vllm_kv_events), reads back what Encode writes, and refuses the malformed by
// name. (tests/node/vllm_kv_events_test.mjs decodes a live worker's with an independent decoder.)
#include "common/kv/vllm_kv_events.h"

#include <map>
#include <msgpack.hpp>
#include <string>
#include <vector>

#include "common/file_util.h"
#include "gtest/gtest.h"
#include "tests/testing/paths.h"
#include "tests/testing/status_matchers.h"

namespace kvserve::vllm_events {
namespace {

BlockHash Hash(uint64_t low) { return {low, ~low}; }

std::vector<Event> TwoStoredOneRemoved() {
  std::vector<Event> events;
  const std::vector<int32_t> a = {1, 2}, b = {3, 4};
  AddStoredBlock(events, Hash(10), std::nullopt, a, 2, "GPU");
  AddStoredBlock(events, Hash(11), Hash(10), b, 2, "GPU");  // extends the chain
  AddRemovedBlock(events, Hash(7), "CPU");
  events.push_back({.kind = Event::Kind::kAllCleared});
  return events;
}

msgpack::object_handle Unpack(const std::string& payload) {
  return msgpack::unpack(payload.data(), payload.size());
}

std::vector<int64_t> Ints(const msgpack::object& o) { return o.as<std::vector<int64_t>>(); }

TEST(VllmKvEventsTest, MapEncodingHasVllmFieldsInOrder) {
  const std::string payload = Encode(
      {.ts = 12.5, .events = TwoStoredOneRemoved(), .data_parallel_rank = 0}, Encoding::kMap);
  msgpack::object_handle h = Unpack(payload);
  const msgpack::object& batch = h.get();
  ASSERT_EQ(batch.type, msgpack::type::ARRAY);
  ASSERT_EQ(batch.via.array.size, 3u);
  EXPECT_EQ(batch.via.array.ptr[0].type, msgpack::type::FLOAT64);
  EXPECT_DOUBLE_EQ(batch.via.array.ptr[0].as<double>(), 12.5);
  EXPECT_EQ(batch.via.array.ptr[2].as<int>(), 0);
  const msgpack::object& events = batch.via.array.ptr[1];
  ASSERT_EQ(events.via.array.size, 3u);  // the chain is one event

  const msgpack::object& stored = events.via.array.ptr[0];
  ASSERT_EQ(stored.type, msgpack::type::MAP);
  std::vector<std::string> keys;
  std::map<std::string, msgpack::object> f;
  for (uint32_t i = 0; i < stored.via.map.size; ++i) {
    keys.push_back(stored.via.map.ptr[i].key.as<std::string>());
    f[keys.back()] = stored.via.map.ptr[i].val;
  }
  EXPECT_EQ(keys,
            (std::vector<std::string>{"type", "block_hashes", "parent_block_hash", "token_ids",
                                      "block_size", "lora_id", "medium", "lora_name"}));
  EXPECT_EQ(f["type"].as<std::string>(), "BlockStored");
  EXPECT_EQ(Ints(f["block_hashes"]), (std::vector<int64_t>{10, 11}));
  EXPECT_TRUE(f["parent_block_hash"].is_nil());
  EXPECT_EQ(Ints(f["token_ids"]), (std::vector<int64_t>{1, 2, 3, 4}));
  EXPECT_EQ(f["block_size"].as<int>(), 2);
  EXPECT_TRUE(f["lora_id"].is_nil());
  EXPECT_EQ(f["medium"].as<std::string>(), "GPU");
  EXPECT_TRUE(f["lora_name"].is_nil());

  const msgpack::object& removed = events.via.array.ptr[1];
  ASSERT_EQ(removed.via.map.size, 3u);
  EXPECT_EQ(removed.via.map.ptr[0].key.as<std::string>(), "type");
  EXPECT_EQ(removed.via.map.ptr[0].val.as<std::string>(), "BlockRemoved");
  EXPECT_EQ(removed.via.map.ptr[1].key.as<std::string>(), "block_hashes");
  EXPECT_EQ(Ints(removed.via.map.ptr[1].val), (std::vector<int64_t>{7}));
  EXPECT_EQ(removed.via.map.ptr[2].key.as<std::string>(), "medium");
  EXPECT_EQ(removed.via.map.ptr[2].val.as<std::string>(), "CPU");

  const msgpack::object& cleared = events.via.array.ptr[2];
  ASSERT_EQ(cleared.via.map.size, 1u);
  EXPECT_EQ(cleared.via.map.ptr[0].val.as<std::string>(), "AllBlocksCleared");
}

TEST(VllmKvEventsTest, ArrayEncodingIsTheLayoutUpToVllm023) {
  std::vector<Event> events = TwoStoredOneRemoved();
  events[0].parent_block_hash = 99;
  msgpack::object_handle h = Unpack(Encode({.ts = 1, .events = events}, Encoding::kArray));
  const msgpack::object& list = h.get().via.array.ptr[1];
  const msgpack::object& stored = list.via.array.ptr[0];
  ASSERT_EQ(stored.type, msgpack::type::ARRAY);
  ASSERT_EQ(stored.via.array.size, 8u);
  const msgpack::object* s = stored.via.array.ptr;
  EXPECT_EQ(s[0].as<std::string>(), "BlockStored");
  EXPECT_EQ(Ints(s[1]), (std::vector<int64_t>{10, 11}));
  EXPECT_EQ(s[2].as<int64_t>(), 99);
  EXPECT_EQ(Ints(s[3]), (std::vector<int64_t>{1, 2, 3, 4}));
  EXPECT_EQ(s[4].as<int>(), 2);
  EXPECT_TRUE(s[5].is_nil());
  EXPECT_EQ(s[6].as<std::string>(), "GPU");
  EXPECT_TRUE(s[7].is_nil());  // lora_name
  const msgpack::object& removed = list.via.array.ptr[1];
  ASSERT_EQ(removed.via.array.size, 3u);
  EXPECT_EQ(removed.via.array.ptr[0].as<std::string>(), "BlockRemoved");
  EXPECT_EQ(removed.via.array.ptr[2].as<std::string>(), "CPU");
  const msgpack::object& cleared = list.via.array.ptr[2];
  ASSERT_EQ(cleared.via.array.size, 1u);
  EXPECT_EQ(cleared.via.array.ptr[0].as<std::string>(), "AllBlocksCleared");
}

TEST(VllmKvEventsTest, ChainsMergeOnlyWhenTheyContinue) {
  std::vector<Event> events;
  const std::vector<int32_t> t = {5, 6};
  AddStoredBlock(events, Hash(1), std::nullopt, t, 2, "GPU");
  AddStoredBlock(events, Hash(3), Hash(2), t, 2, "GPU");  // another parent: a new event
  AddStoredBlock(events, Hash(4), Hash(3), t, 2, "CPU");  // another medium: a new event
  AddStoredBlock(events, Hash(5), Hash(4), t, 2, "CPU");
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[1].parent_block_hash, ExternalHash(Hash(2)));
  EXPECT_EQ(events[2].block_hashes.size(), 2u);
  EXPECT_EQ(events[2].token_ids.size(), 4u);
  AddRemovedBlock(events, Hash(1), "GPU");
  AddRemovedBlock(events, Hash(3), "GPU");
  AddRemovedBlock(events, Hash(4), "CPU");
  ASSERT_EQ(events.size(), 5u);
  EXPECT_EQ(events[3].block_hashes.size(), 2u);
}

TEST(VllmKvEventsTest, HashesAreNonNegative64BitIntegers) {
  EXPECT_EQ(ExternalHash({0xffff'ffff'ffff'ffffULL, 0}), 0x7fff'ffff'ffff'ffffLL);
  EXPECT_EQ(ExternalHash({42, 1}), 42);
  EXPECT_EQ(ExternalHash({42, 2}), ExternalHash({42, 1})) << "the low half alone";
}

TEST(VllmKvEventsTest, EncodingNames) {
  EXPECT_EQ(*ParseEncoding("map"), Encoding::kMap);
  EXPECT_EQ(*ParseEncoding("array"), Encoding::kArray);
  EXPECT_THAT(ParseEncoding("tuple"),
              kvserve::testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                         ::testing::HasSubstr("'map' (vLLM 0.24 on")));
}

Batch Seed(const std::string& name) {
  absl::StatusOr<std::string> bytes =
      ReadFileToString(kvserve::testing::SourceDir() + "/tests/fuzz/corpus/vllm_kv_events/" + name);
  EXPECT_OK(bytes.status());
  absl::StatusOr<Batch> b = Decode(bytes.value_or(""));
  EXPECT_OK(b.status()) << name;
  return b.value_or(Batch{});
}

TEST(VllmKvEventsTest, DecodesEveryVllmLayout) {
  const Batch map = Seed("map_batch");  // vLLM 0.24 on
  EXPECT_DOUBLE_EQ(map.ts, 1796370000.5);
  ASSERT_EQ(map.events.size(), 3u);
  EXPECT_EQ(map.events[0].kind, Event::Kind::kStored);
  EXPECT_EQ(map.events[0].block_hashes, (std::vector<int64_t>{11, 12}));
  EXPECT_FALSE(map.events[0].parent_block_hash.has_value());
  EXPECT_EQ(map.events[0].token_ids, (std::vector<int32_t>{1, 2, 3, 4}));
  EXPECT_EQ(map.events[0].block_size, 2);
  EXPECT_EQ(map.events[0].medium, "GPU");
  EXPECT_EQ(map.events[1].kind, Event::Kind::kRemoved);
  EXPECT_EQ(map.events[2].kind, Event::Kind::kAllCleared);

  const Batch array = Seed("array_batch");  // vLLM 0.10 (its arrays ended at medium)
  ASSERT_EQ(array.events.size(), 3u);
  EXPECT_EQ(array.events[0].parent_block_hash, 7);
  EXPECT_EQ(array.events[0].medium, "CPU");
  EXPECT_EQ(array.events[1].block_hashes, (std::vector<int64_t>{12}));

  const Batch v09 = Seed("v09_batch");  // vLLM 0.9: no medium, no rank, a uint64 hash
  ASSERT_EQ(v09.events.size(), 2u);
  EXPECT_EQ(static_cast<uint64_t>(v09.events[0].block_hashes[0]), (1ULL << 63) + 5);
  EXPECT_EQ(v09.events[0].medium, "");

  int unknown = 0;  // vLLM's newest: a map batch, bytes hashes, more fields, a new event type
  absl::StatusOr<std::string> bytes = ReadFileToString(
      kvserve::testing::SourceDir() + "/tests/fuzz/corpus/vllm_kv_events/newest_map_batch");
  ASSERT_OK_AND_ASSIGN(Batch newest, Decode(*bytes, &unknown));
  EXPECT_EQ(unknown, 1);
  EXPECT_EQ(newest.data_parallel_rank, 1);
  ASSERT_EQ(newest.events.size(), 1u);
  EXPECT_EQ(newest.events[0].block_hashes.size(), 2u);
  EXPECT_NE(newest.events[0].block_hashes[0], newest.events[0].block_hashes[1]);
}

TEST(VllmKvEventsTest, DecodeReadsBackEncode) {
  std::vector<Event> events = TwoStoredOneRemoved();
  for (Encoding e : {Encoding::kMap, Encoding::kArray}) {
    ASSERT_OK_AND_ASSIGN(Batch b, Decode(Encode({.ts = 3.25, .events = events}, e)));
    EXPECT_DOUBLE_EQ(b.ts, 3.25);
    ASSERT_EQ(b.events.size(), events.size());
    for (size_t i = 0; i < events.size(); ++i) {
      EXPECT_EQ(b.events[i].kind, events[i].kind);
      EXPECT_EQ(b.events[i].block_hashes, events[i].block_hashes);
      EXPECT_EQ(b.events[i].token_ids, events[i].token_ids);
      EXPECT_EQ(b.events[i].parent_block_hash, events[i].parent_block_hash);
      EXPECT_EQ(b.events[i].medium, events[i].medium);
    }
  }
}

TEST(VllmKvEventsTest, DecodeRefusesTheMalformedByName) {
  auto packed = [](auto&& fill) {
    msgpack::sbuffer buf;
    msgpack::packer<msgpack::sbuffer> pk(&buf);
    fill(pk);
    return std::string(buf.data(), buf.size());
  };
  using Pk = msgpack::packer<msgpack::sbuffer>;
  const std::pair<std::string, const char*> bad[] = {
      {"\xc1", "not msgpack"},
      {packed([](Pk& pk) { pk.pack(7); }), "not [ts, events"},
      {packed([](Pk& pk) {
         pk.pack_array(2);
         pk.pack(1.0);
         pk.pack(std::string("x"));
       }),
       "events is not a list"},
      {packed([](Pk& pk) {
         pk.pack_array(2);
         pk.pack(1.0);
         pk.pack_array(1);
         pk.pack_array(5);
         pk.pack(std::string("BlockStored"));
         pk.pack(std::vector<int>{1});
         pk.pack_nil();
         pk.pack(std::vector<int>{1, 2, 3});
         pk.pack(2);
       }),
       "3 token ids for 1 blocks of 2"},
      {packed([](Pk& pk) {
         pk.pack_array(2);
         pk.pack(1.0);
         pk.pack_array(1);
         pk.pack_array(2);
         pk.pack(std::string("BlockRemoved"));
         pk.pack(std::string("not a list"));
       }),
       "block_hashes is not a list"},
      {packed([](Pk& pk) {  // nested past the depth a batch needs
         pk.pack_array(2);
         pk.pack(1.0);
         for (int i = 0; i < 12; ++i) pk.pack_array(1);
         pk.pack_nil();
       }),
       "not msgpack within limits"},
  };
  for (const auto& [payload, says] : bad) {
    EXPECT_THAT(Decode(payload), kvserve::testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                                            ::testing::HasSubstr(says)))
        << says;
  }
}

}  // namespace
}  // namespace kvserve::vllm_events
