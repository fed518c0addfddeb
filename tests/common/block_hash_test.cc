#include "common/kv/block_hash.h"

#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "common/file_util.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/paths.h"
#include "tests/testing/status_matchers.h"
#include "xxhash.h"

namespace kvserve {
namespace {

using ::kvserve::testing::StatusIs;
using ::testing::HasSubstr;

CacheKey BaseKey() {
  return CacheKey{.model_id = "m",
                  .kv_cache_dtype = "bf16",
                  .kv_quant = "",
                  .block_size = 4,
                  .tensor_parallel_size = 1,
                  .cache_salt = ""};
}

std::vector<uint32_t> Tokens(int n) {
  std::vector<uint32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = 1000 + 7 * i;
  return t;
}

TEST(BlockHashTest, MatchesTestVectorsMadeByXxhsum) {
  ASSERT_OK_AND_ASSIGN(
      std::string text,
      ReadFileToString(testing::SourceDir() + "/common/testdata/block_hash_vectors.json"));
  nlohmann::json doc = nlohmann::json::parse(text);
  ASSERT_GE(doc["vectors"].size(), 8u);
  for (const auto& v : doc["vectors"]) {
    SCOPED_TRACE(v["name"].get<std::string>());
    const auto& k = v["cache_key"];
    CacheKey key{k["model_id"],   k["kv_cache_dtype"],       k["kv_quant"],
                 k["block_size"], k["tensor_parallel_size"], k["cache_salt"]};
    ASSERT_OK_AND_ASSIGN(std::string extra, key.Serialize());
    EXPECT_EQ(absl::BytesToHexString(extra), v["extra_key_hex"].get<std::string>());
    std::vector<uint32_t> tokens = v["tokens"].get<std::vector<uint32_t>>();
    std::vector<BlockHash> hashes = HashFullBlocks(tokens, key.block_size, extra);
    ASSERT_EQ(hashes.size(), v["blocks"].size());
    for (size_t i = 0; i < hashes.size(); ++i) {
      EXPECT_EQ(hashes[i].ToHex(), v["blocks"][i]["hash_hex"].get<std::string>()) << "block " << i;
      // The documented input bytes: parent || tokens || extra key.
      std::string input = (i == 0 ? std::string(16, '\0') : hashes[i - 1].ToBytes());
      for (size_t t = i * key.block_size; t < (i + 1) * key.block_size; ++t) {
        for (int b = 0; b < 4; ++b)
          input.push_back(static_cast<char>((tokens[t] >> (8 * b)) & 0xff));
      }
      input += extra;
      EXPECT_EQ(absl::BytesToHexString(input), v["blocks"][i]["input_hex"].get<std::string>());
    }
  }
}

// Blocks whose input outgrows HashBlock's stack buffer (large blocks, a long salt) hash their
// documented bytes the same way: XXH3-128 of parent || tokens (uint32 little-endian) || extra.
TEST(BlockHashTest, LargeBlocksHashTheDocumentedBytes) {
  const BlockHash parent{0x0123456789abcdefULL, 0xfedcba9876543210ULL};
  for (const int block_size : {16, 250, 256, 1024}) {
    for (const size_t extra_size : {0, 35, 2000}) {
      const std::vector<uint32_t> tokens = Tokens(block_size);
      const std::string extra(extra_size, 'x');
      std::string input = parent.ToBytes();
      for (uint32_t t : tokens) {
        for (int b = 0; b < 4; ++b) input.push_back(static_cast<char>((t >> (8 * b)) & 0xff));
      }
      input += extra;
      const XXH128_hash_t want = XXH3_128bits(input.data(), input.size());
      const BlockHash got = HashBlock(&parent, tokens, extra);
      EXPECT_EQ(got, (BlockHash{want.low64, want.high64}))
          << "block size " << block_size << ", extra key " << extra_size << " bytes";
    }
  }
}

TEST(BlockHashTest, OnlyFullBlocksAreHashed) {
  ASSERT_OK_AND_ASSIGN(std::string extra, BaseKey().Serialize());
  EXPECT_EQ(HashFullBlocks(Tokens(3), 4, extra).size(), 0u);
  EXPECT_EQ(HashFullBlocks(Tokens(4), 4, extra).size(), 1u);
  EXPECT_EQ(HashFullBlocks(Tokens(11), 4, extra).size(), 2u);
}

TEST(BlockHashTest, ChainsParentIntoChild) {
  ASSERT_OK_AND_ASSIGN(std::string extra, BaseKey().Serialize());
  std::vector<uint32_t> a = Tokens(8);
  std::vector<uint32_t> b = a;
  b[0] += 1;  // differs only in block 0
  std::vector<BlockHash> ha = HashFullBlocks(a, 4, extra);
  std::vector<BlockHash> hb = HashFullBlocks(b, 4, extra);
  EXPECT_NE(ha[0], hb[0]);
  EXPECT_NE(ha[1], hb[1]);  // same tokens in block 1, different parent
  // A prefix has the same hashes as the longer sequence's leading blocks.
  std::vector<BlockHash> prefix = HashFullBlocks(absl::MakeSpan(a).subspan(0, 4), 4, extra);
  EXPECT_EQ(prefix[0], ha[0]);
}

TEST(BlockHashTest, EveryInputByteChangesTheHash) {
  ASSERT_OK_AND_ASSIGN(std::string extra, BaseKey().Serialize());
  const std::vector<uint32_t> tokens = Tokens(4);
  const BlockHash parent{0x0123456789abcdefULL, 0xfedcba9876543210ULL};
  const BlockHash base = HashBlock(&parent, tokens, extra);
  absl::flat_hash_set<BlockHash> seen = {base};
  EXPECT_NE(HashBlock(nullptr, tokens, extra), base);
  for (int bit = 0; bit < 128; ++bit) {  // every parent bit
    BlockHash p = parent;
    (bit < 64 ? p.low : p.high) ^= uint64_t{1} << (bit % 64);
    EXPECT_TRUE(seen.insert(HashBlock(&p, tokens, extra)).second) << "parent bit " << bit;
  }
  for (size_t i = 0; i < tokens.size(); ++i) {  // every byte of every token
    for (int byte = 0; byte < 4; ++byte) {
      std::vector<uint32_t> t = tokens;
      t[i] ^= uint32_t{1} << (8 * byte);
      EXPECT_TRUE(seen.insert(HashBlock(&parent, t, extra)).second) << "token " << i;
    }
  }
  for (size_t i = 0; i < extra.size(); ++i) {  // every byte of the extra key
    std::string e = extra;
    e[i] ^= 0x01;
    EXPECT_TRUE(seen.insert(HashBlock(&parent, tokens, e)).second) << "extra byte " << i;
  }
}

TEST(BlockHashTest, CacheKeyFieldsSeparateCaches) {
  const CacheKey base = BaseKey();
  std::vector<CacheKey> variants(7, base);
  variants[1].model_id = "other";
  variants[2].kv_cache_dtype = "int8";
  variants[3].kv_quant = "per_group:128";
  variants[4].block_size = 16;
  variants[5].tensor_parallel_size = 2;
  variants[6].cache_salt = "tenant-b";
  absl::flat_hash_set<BlockHash> seen;
  for (const CacheKey& k : variants) {
    ASSERT_OK_AND_ASSIGN(std::string extra, k.Serialize());
    EXPECT_TRUE(seen.insert(HashBlock(nullptr, Tokens(4), extra)).second);
  }
  // Length prefixes keep field boundaries: ("ab", "") differs from ("a", "b").
  CacheKey x = base, y = base;
  x.model_id = "ab";
  x.kv_cache_dtype = "";
  y.model_id = "a";
  y.kv_cache_dtype = "b";
  EXPECT_NE(*x.Serialize(), *y.Serialize());
}

TEST(BlockHashTest, CacheKeyRejectsBadFields) {
  CacheKey k = BaseKey();
  k.cache_salt = std::string(70000, 's');
  EXPECT_THAT(k.Serialize(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("cache_salt")));
  k = BaseKey();
  k.block_size = 0;
  EXPECT_THAT(k.Serialize(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("block_size")));
}

TEST(BlockHashTest, BytesRoundTrip) {
  BlockHash h{0x1122334455667788ULL, 0x99aabbccddeeff00ULL};
  EXPECT_EQ(h.ToHex(),
            "8877665544332211"
            "00ffeeddccbbaa99");
  ASSERT_OK_AND_ASSIGN(BlockHash back, BlockHash::FromBytes(h.ToBytes()));
  EXPECT_EQ(back, h);
  EXPECT_THAT(BlockHash::FromBytes("short"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("16 bytes")));
}

}  // namespace
}  // namespace kvserve
