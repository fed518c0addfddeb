// The KV transfer's wire format (worker/kv_cache/kv_block_wire.h): blocks travel as stored, in
// every KV format, and land byte for byte in other blocks of another pool; a corrupted byte, a
// truncated wire or a pool of another shape is refused before anything is written; the wire
// shrinks with the format (int4 at most 0.3 of bf16's bytes).
#include "worker/kv_cache/kv_block_wire.h"

#include <random>
#include <string>
#include <vector>

#include "common/kv/kv_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace kvserve::worker {
namespace {

using kvserve::testing::StatusIs;
using ::testing::HasSubstr;

constexpr int kLayers = 2, kHeads = 2, kBlockSize = 4;

KvCacheSpec Spec(const std::string& dtype, const std::string& granularity, int head_dim) {
  absl::StatusOr<KvCacheSpec> s =
      MakeKvCacheSpec({.dtype = dtype, .granularity = granularity, .group_size = 8}, kLayers,
                      head_dim, KvDType::kBf16);
  EXPECT_TRUE(s.ok()) << s.status();
  return *s;
}

// Every byte of every buffer of the pool, random.
void Fill(KvStorage& s, uint32_t seed) {
  std::mt19937 rng(seed);
  for (int l = 0; l < s.num_layers(); ++l) {
    const kernels::KvCacheView v = s.View(l);
    const int64_t units = v.num_blocks * v.num_kv_heads;
    const int64_t kd = units * v.k_format.RowBytes(static_cast<int>(v.head_dim)) * v.block_size;
    const int64_t vd = units * v.v_format.RowBytes(static_cast<int>(v.head_dim)) * v.block_size;
    for (int64_t i = 0; i < kd; ++i) v.k[i] = static_cast<uint8_t>(rng());
    for (int64_t i = 0; i < vd; ++i) v.v[i] = static_cast<uint8_t>(rng());
    const int64_t ks = units * v.k_format.ScaleEntries(kBlockSize, static_cast<int>(v.head_dim));
    const int64_t vs = units * v.v_format.ScaleEntries(kBlockSize, static_cast<int>(v.head_dim));
    for (int64_t i = 0; i < ks; ++i) v.k_scales[i] = static_cast<uint16_t>(rng());
    for (int64_t i = 0; i < vs; ++i) v.v_scales[i] = static_cast<uint16_t>(rng());
  }
}

// Block `b` of `s` as bytes, read straight from the pool's buffers (the CPU backend's memory).
std::string Bytes(KvStorage& s, int b) {
  std::string out;
  for (int l = 0; l < s.num_layers(); ++l) {
    const kernels::KvCacheView v = s.View(l);
    const auto add = [&](const void* base, int64_t per_block) {
      out.append(static_cast<const char*>(base) + b * per_block, per_block);
    };
    const int hd = static_cast<int>(v.head_dim);
    add(v.k, kHeads * v.k_format.RowBytes(hd) * kBlockSize);
    add(v.v, kHeads * v.v_format.RowBytes(hd) * kBlockSize);
    if (v.k_scales) add(v.k_scales, 2 * kHeads * v.k_format.ScaleEntries(kBlockSize, hd));
    if (v.v_scales) add(v.v_scales, 2 * kHeads * v.v_format.ScaleEntries(kBlockSize, hd));
  }
  return out;
}

BlockHash H(uint64_t n) { return {.low = n, .high = ~n}; }

struct Format {
  std::string dtype, granularity;
};

class KvBlockWireTest : public ::testing::TestWithParam<Format> {
 protected:
  std::unique_ptr<kernels::Backend> cpu_ = kernels::CreateCpuBackend({.num_threads = 1});
};

TEST_P(KvBlockWireTest, BlocksLandByteForByteInOtherBlocksOfAnotherPool) {
  const KvCacheSpec spec = Spec(GetParam().dtype, GetParam().granularity, 16);
  KvStorage sender(spec, 8, kHeads, kBlockSize, 16, cpu_.get());
  KvStorage receiver(spec, 4, kHeads, kBlockSize, 16, cpu_.get());
  Fill(sender, 1);
  ASSERT_OK_AND_ASSIGN(std::string wire, EncodeBlocks(sender, *cpu_, {5, 2}, {H(50), H(20)}));
  ASSERT_OK_AND_ASSIGN(std::vector<WireBlock> got, ReadBlocks(wire, receiver));
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].hash, H(50));
  EXPECT_EQ(got[1].hash, H(20));
  const std::string untouched = Bytes(receiver, 1);
  WriteBlock(receiver, *cpu_, 0, got[0]);
  WriteBlock(receiver, *cpu_, 3, got[1]);
  EXPECT_EQ(Bytes(receiver, 0), Bytes(sender, 5));
  EXPECT_EQ(Bytes(receiver, 3), Bytes(sender, 2));
  EXPECT_EQ(Bytes(receiver, 1), untouched);
  EXPECT_EQ(static_cast<int64_t>(Bytes(sender, 0).size()), WireBlockBytes(sender));
}

TEST_P(KvBlockWireTest, ACorruptedOrTruncatedWireIsRefusedNamingTheBlock) {
  const KvCacheSpec spec = Spec(GetParam().dtype, GetParam().granularity, 16);
  KvStorage pool(spec, 4, kHeads, kBlockSize, 16, cpu_.get());
  Fill(pool, 2);
  ASSERT_OK_AND_ASSIGN(std::string wire, EncodeBlocks(pool, *cpu_, {0, 1, 2}, {H(1), H(2), H(3)}));
  std::string bad = wire;
  bad[wire.size() - 8 - WireBlockBytes(pool) / 2] ^= 0x10;  // a byte of the last block
  EXPECT_THAT(ReadBlocks(bad, pool),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("block 2 of 3 fails its checksum")));
  EXPECT_THAT(ReadBlocks(wire.substr(0, wire.size() - 1), pool),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("for 3 blocks")));
  EXPECT_THAT(ReadBlocks(wire.substr(0, 10), pool),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("truncated")));
  EXPECT_THAT(ReadBlocks("GET / HTTP/1.1", pool),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("KVBW")));
}

// The link path's pieces on the CPU: the leading ranges of a pool are its first blocks' bytes,
// layer by layer, and the link header carries the hashes and the fingerprint, refusing a
// flipped byte, a truncation, another shape and a block wire.
TEST_P(KvBlockWireTest, LinkHeaderAndLeadingRanges) {
  const KvCacheSpec spec = Spec(GetParam().dtype, GetParam().granularity, 16);
  KvStorage pool(spec, 4, kHeads, kBlockSize, 16, cpu_.get());
  Fill(pool, 3);
  const std::vector<kernels::ByteRange> ranges = LeadingRanges(pool, 2);
  size_t total = 0;
  for (const kernels::ByteRange& r : ranges) total += r.bytes;
  EXPECT_EQ(static_cast<int64_t>(total), 2 * WireBlockBytes(pool));
  const uint64_t fingerprint = cpu_->Fingerprint(ranges);
  const std::string header = EncodeLinkHeader(pool, {H(7), H(8)}, fingerprint);
  ASSERT_OK_AND_ASSIGN(LinkHeader got, ReadLinkHeader(header, pool));
  EXPECT_EQ(got.hashes, (std::vector<BlockHash>{H(7), H(8)}));
  EXPECT_EQ(got.fingerprint, fingerprint);
  std::string bad = header;
  bad[bad.size() - 20] ^= 1;  // a byte of the last hash
  EXPECT_THAT(ReadLinkHeader(bad, pool),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("checksum")));
  EXPECT_THAT(ReadLinkHeader(header.substr(0, header.size() - 1), pool),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("2 block hashes")));
  KvStorage other(spec, 4, 1, kBlockSize, 16, cpu_.get());
  EXPECT_THAT(ReadLinkHeader(header, other), StatusIs(absl::StatusCode::kFailedPrecondition,
                                                      HasSubstr("KV heads (per rank) is 2")));
  ASSERT_OK_AND_ASSIGN(std::string wire, EncodeBlocks(pool, *cpu_, {0}, {H(1)}));
  EXPECT_THAT(ReadLinkHeader(wire, pool),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("KVBL")));
  EXPECT_THAT(ReadBlocks(header, pool),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("KVBW")));
  // A changed byte in the blocks changes the fingerprint the receiver computes.
  const_cast<uint8_t*>(static_cast<const uint8_t*>(ranges.back().data))[0] ^= 1;
  EXPECT_NE(cpu_->Fingerprint(ranges), fingerprint);
}

INSTANTIATE_TEST_SUITE_P(EveryFormat, KvBlockWireTest,
                         ::testing::Values(Format{"fp32", "per_token"}, Format{"bf16", "per_token"},
                                           Format{"fp16", "per_token"},
                                           Format{"fp8_e4m3", "per_token"},
                                           Format{"int8", "per_channel"},
                                           Format{"int8", "k:per_channel,v:per_token"},
                                           Format{"int4", "per_group"}),
                         [](const auto& info) {
                           std::string n = info.param.dtype + "_" + info.param.granularity;
                           for (char& c : n) {
                             if (!isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return n;
                         });

TEST(KvBlockWireShapeTest, APoolOfAnotherShapeIsRefusedNamingWhat) {
  auto cpu = kernels::CreateCpuBackend({.num_threads = 1});
  KvStorage sender(Spec("int8", "per_token", 16), 2, kHeads, kBlockSize, 16, cpu.get());
  ASSERT_OK_AND_ASSIGN(std::string wire, EncodeBlocks(sender, *cpu, {1}, {H(1)}));
  KvStorage other_format(Spec("int4", "per_token", 16), 2, kHeads, kBlockSize, 16, cpu.get());
  EXPECT_THAT(ReadBlocks(wire, other_format),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("KV formats")));
  KvStorage other_heads(Spec("int8", "per_token", 16), 2, 1, kBlockSize, 16, cpu.get());
  EXPECT_THAT(ReadBlocks(wire, other_heads), StatusIs(absl::StatusCode::kFailedPrecondition,
                                                      HasSubstr("KV heads (per rank) is 2")));
  KvStorage other_block(Spec("int8", "per_token", 16), 2, kHeads, 8, 16, cpu.get());
  EXPECT_THAT(ReadBlocks(wire, other_block),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("block size")));
  EXPECT_THAT(EncodeBlocks(sender, *cpu, {2}, {H(1)}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("outside the pool of 2")));
}

TEST(KvBlockWireShapeTest, TheWireShrinksWithTheFormat) {
  // A Llama-8B-shaped head (128 channels), blocks of 16 tokens.
  auto cpu = kernels::CreateCpuBackend({.num_threads = 1});
  const auto bytes = [&](const std::string& dtype, const std::string& granularity) {
    KvStorage s(Spec(dtype, granularity, 128), 1, kHeads, 16, 128, cpu.get());
    return static_cast<double>(EncodeBlocks(s, *cpu, {0}, {H(0)})->size());
  };
  const double bf16 = bytes("bf16", "per_token");
  EXPECT_LE(bytes("fp8_e4m3", "per_token") / bf16, 0.52);
  EXPECT_LE(bytes("int8", "per_token") / bf16, 0.52);
  EXPECT_LE(bytes("int4", "per_token") / bf16, 0.30);
}

}  // namespace
}  // namespace kvserve::worker
