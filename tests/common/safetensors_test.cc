#include "common/model/safetensors.h"

#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/file_util.h"
#include "common/model/hf_config.h"
#include "common/model/model_weights.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/paths.h"
#include "tests/testing/status_matchers.h"

namespace kvserve {
namespace {

namespace fs = std::filesystem;
using ::kvserve::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr const char* kModels[] = {"tiny-llama3", "tiny-qwen2", "tiny-qwen3"};

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// A safetensors file with a hand-written header and `data_size` data bytes.
std::string RawFile(const std::string& header, size_t data_size, uint64_t declared_len = 0) {
  uint64_t len = declared_len != 0 ? declared_len : header.size();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((len >> (8 * i)) & 0xff);
  return out + header + std::string(data_size, '\x01');
}

TEST(SafetensorsTest, FixturesHaveEveryTensorTheConfigRequires) {
  for (const char* model : kModels) {
    SCOPED_TRACE(model);
    const std::string dir = testing::FixtureModel(model);
    ASSERT_OK_AND_ASSIGN(ModelConfig config, LoadHfConfig(dir + "/config.json"));
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Checkpoint> ckpt, Checkpoint::Open(dir));
    std::vector<WeightSpec> expected = ExpectedWeights(config);
    EXPECT_EQ(ckpt->tensors().size(), expected.size()) << "no extra or missing tensors";
    int64_t bytes = 0;
    for (const WeightSpec& w : expected) {
      ASSERT_OK_AND_ASSIGN(const TensorInfo* t, ckpt->Find(w.name));
      EXPECT_EQ(t->dtype, DType::kF32) << w.name;
      EXPECT_EQ(t->shape, w.shape) << w.name;
      bytes += t->NumElements() * 4;
    }
    EXPECT_EQ(ckpt->TotalBytes(), bytes);
    EXPECT_OK(CheckWeights(config, *ckpt));
  }
}

TEST(SafetensorsTest, ReadsValuesAndMetadata) {
  const std::string dir = testing::FixtureModel("tiny-llama3");
  ASSERT_OK_AND_ASSIGN(auto file, SafetensorsFile::Open(dir + "/reference_logits.safetensors"));
  const TensorInfo& logits = file->tensors().at("logits_0");
  EXPECT_EQ(logits.shape, (std::vector<int64_t>{7, 1024}));
  std::vector<float> v = logits.ToFloat32();
  ASSERT_EQ(v.size(), 7u * 1024u);
  float raw;
  std::memcpy(&raw, logits.bytes.data() + 4 * 1030, 4);
  EXPECT_EQ(v[1030], raw);
  ASSERT_OK_AND_ASSIGN(auto weights, SafetensorsFile::Open(dir + "/model.safetensors"));
  EXPECT_EQ(weights->metadata().at("format"), "pt");
}

TEST(SafetensorsTest, WriterRoundTripsEveryDType) {
  const std::string path = testing::MakeTempDir() + "/t.safetensors";
  const float f32[] = {1.5f, -2.0f};
  const uint16_t f16[] = {0x3c00, 0xc000, 0x0001};  // 1, -2, smallest subnormal
  const uint16_t bf16[] = {0x3fc0, 0xc000};         // 1.5, -2
  const uint8_t f8[] = {0x38, 0x7e, 0xfe, 0x01};    // 1, 448, -448, 2^-9
  const int8_t i8[] = {-3, 4};
  std::vector<TensorToWrite> tensors = {
      {"f32", DType::kF32, {2}, {reinterpret_cast<const char*>(f32), sizeof(f32)}},
      {"f16", DType::kF16, {3}, {reinterpret_cast<const char*>(f16), sizeof(f16)}},
      {"bf16", DType::kBF16, {1, 2}, {reinterpret_cast<const char*>(bf16), sizeof(bf16)}},
      {"f8", DType::kF8E4M3, {4}, {reinterpret_cast<const char*>(f8), sizeof(f8)}},
      {"i8", DType::kI8, {2}, {reinterpret_cast<const char*>(i8), sizeof(i8)}},
  };
  ASSERT_OK(WriteSafetensors(path, tensors, {{"k", "v"}}));
  ASSERT_OK_AND_ASSIGN(auto file, SafetensorsFile::Open(path));
  EXPECT_EQ(file->tensors().at("f32").ToFloat32(), (std::vector<float>{1.5f, -2.0f}));
  EXPECT_EQ(file->tensors().at("f16").ToFloat32(),
            (std::vector<float>{1.0f, -2.0f, 5.9604644775390625e-08f}));
  EXPECT_EQ(file->tensors().at("bf16").ToFloat32(), (std::vector<float>{1.5f, -2.0f}));
  EXPECT_EQ(file->tensors().at("f8").ToFloat32(),
            (std::vector<float>{1.0f, 448.0f, -448.0f, 0.001953125f}));
  EXPECT_EQ(file->tensors().at("i8").dtype, DType::kI8);
  EXPECT_EQ(file->metadata().at("k"), "v");
  EXPECT_THAT(WriteSafetensors(path, {{"x", DType::kF32, {3}, {"ab", 2}}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'x'")));
}

TEST(SafetensorsTest, ShardedCheckpointWithIndex) {
  const std::string src = testing::FixtureModel("tiny-qwen3");
  ASSERT_OK_AND_ASSIGN(auto whole, Checkpoint::Open(src));
  const std::string dir = testing::MakeTempDir();
  std::vector<TensorToWrite> shard[2];
  nlohmann::json index = {{"metadata", {{"total_size", whole->TotalBytes()}}},
                          {"weight_map", nlohmann::json::object()}};
  int i = 0;
  for (const auto& [name, info] : whole->tensors()) {
    int s = (i++) % 2;
    shard[s].push_back({name,
                        info->dtype,
                        info->shape,
                        {reinterpret_cast<const char*>(info->bytes.data()), info->bytes.size()}});
    index["weight_map"][name] =
        s == 0 ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  ASSERT_OK(WriteSafetensors(dir + "/model-00001-of-00002.safetensors", shard[0]));
  ASSERT_OK(WriteSafetensors(dir + "/model-00002-of-00002.safetensors", shard[1]));
  WriteBytes(dir + "/model.safetensors.index.json", index.dump());
  ASSERT_OK_AND_ASSIGN(auto sharded, Checkpoint::Open(dir));
  ASSERT_EQ(sharded->tensors().size(), whole->tensors().size());
  for (const auto& [name, info] : whole->tensors()) {
    ASSERT_OK_AND_ASSIGN(const TensorInfo* t, sharded->Find(name));
    EXPECT_EQ(t->shape, info->shape);
    EXPECT_EQ(t->ToFloat32(), info->ToFloat32()) << name;
  }
  EXPECT_THAT(sharded->Find("nope"), StatusIs(absl::StatusCode::kNotFound, HasSubstr("'nope'")));

  // An index naming a tensor its shard lacks, a missing shard, or a path outside the folder.
  index["weight_map"]["ghost.weight"] = "model-00001-of-00002.safetensors";
  WriteBytes(dir + "/model.safetensors.index.json", index.dump());
  EXPECT_THAT(Checkpoint::Open(dir),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("ghost.weight"), HasSubstr("00001"))));
  index["weight_map"].erase("ghost.weight");
  index["weight_map"]["lm_head.weight"] = "model-00009-of-00002.safetensors";
  WriteBytes(dir + "/model.safetensors.index.json", index.dump());
  EXPECT_THAT(Checkpoint::Open(dir), StatusIs(absl::StatusCode::kNotFound, HasSubstr("00009")));
  index["weight_map"]["lm_head.weight"] = "../model.safetensors";
  WriteBytes(dir + "/model.safetensors.index.json", index.dump());
  EXPECT_THAT(Checkpoint::Open(dir),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("plain file name")));
}

struct Corruption {
  const char* name;
  std::string bytes;
  const char* message;  // expected in the error, besides the file name
};

TEST(SafetensorsTest, CorruptedFilesGiveClearErrors) {
  const std::string dir = testing::MakeTempDir();
  ASSERT_OK_AND_ASSIGN(std::string good, ReadFileToString(testing::FixtureModel("tiny-llama3") +
                                                          "/model.safetensors"));
  const std::string t = R"("w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]})";
  std::vector<Corruption> cases = {
      {"empty", "", "truncated"},
      {"short", "abc", "truncated"},
      {"cut_in_data", good.substr(0, good.size() - 100), "out of range"},
      {"cut_in_header", good.substr(0, 1000), "truncated: header length"},
      {"huge_header", RawFile("{}", 0, uint64_t{200} << 20), "exceeds the limit"},
      {"bad_json", RawFile("{\"w\": [", 0), "not a valid JSON object"},
      {"unknown_dtype",
       RawFile(R"({"w": {"dtype": "F99", "shape": [1], "data_offsets": [0, 4]}})", 4),
       "tensor 'w': unknown dtype 'F99'"},
      {"shape_mismatch",
       RawFile(R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", 8),
       "tensor 'w': byte range holds 8 bytes"},
      {"out_of_range", RawFile("{" + t + "}", 8),
       "tensor 'w': data_offsets [0, 16] are out of range"},
      {"overlap",
       RawFile("{" + t + R"(, "v": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})", 16),
       "overlaps tensor"},
      {"reversed", RawFile(R"({"w": {"dtype": "F32", "shape": [0], "data_offsets": [4, 0]}})", 4),
       "reversed"},
      {"negative_dim",
       RawFile(R"({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4),
       "tensor 'w': shape"},
      {"no_offsets", RawFile(R"({"w": {"dtype": "F32", "shape": [1]}})", 4),
       "tensor 'w': 'data_offsets'"},
  };
  for (const Corruption& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string path = dir + "/" + c.name + ".safetensors";
    WriteBytes(path, c.bytes);
    EXPECT_THAT(
        SafetensorsFile::Open(path),
        StatusIs(absl::StatusCode::kInvalidArgument, AllOf(HasSubstr(path), HasSubstr(c.message))));
  }
  EXPECT_THAT(SafetensorsFile::Open(dir + "/missing.safetensors"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("missing.safetensors")));
}

TEST(SafetensorsTest, CheckWeightsNamesTheBadTensor) {
  const std::string src = testing::FixtureModel("tiny-qwen2");
  ASSERT_OK_AND_ASSIGN(ModelConfig config, LoadHfConfig(src));
  ASSERT_OK_AND_ASSIGN(auto whole, Checkpoint::Open(src));
  const std::string dir = testing::MakeTempDir();
  std::vector<TensorToWrite> tensors;
  std::vector<std::vector<int64_t>> shapes;
  for (const auto& [name, info] : whole->tensors()) {
    if (name == "model.layers.1.self_attn.k_proj.bias") continue;  // dropped
    tensors.push_back({name,
                       info->dtype,
                       info->shape,
                       {reinterpret_cast<const char*>(info->bytes.data()), info->bytes.size()}});
  }
  ASSERT_OK(WriteSafetensors(dir + "/model.safetensors", tensors));
  ASSERT_OK_AND_ASSIGN(auto ckpt, Checkpoint::Open(dir));
  EXPECT_THAT(CheckWeights(config, *ckpt),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("model.layers.1.self_attn.k_proj.bias")));
  config.intermediate_size = 255;
  EXPECT_THAT(
      CheckWeights(config, *whole),
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr("model.layers.0.mlp.gate_proj.weight"), HasSubstr("[256, 96]"))));
}

}  // namespace
}  // namespace kvserve
