#include "common/model/hf_config.h"

#include "common/file_util.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/paths.h"
#include "tests/testing/status_matchers.h"

namespace kvserve {
namespace {

using ::kvserve::testing::StatusIs;
using ::testing::HasSubstr;
using json = nlohmann::json;

ModelConfig Load(const std::string& model, const std::string& file) {
  absl::StatusOr<ModelConfig> c = LoadHfConfig(testing::FixtureModel(model) + "/" + file);
  EXPECT_OK(c);
  return c.ok() ? *c : ModelConfig{};
}

TEST(HfConfigTest, BothLayoutsGiveTheSameConfig) {
  for (const char* model : {"tiny-llama3", "tiny-qwen2", "tiny-qwen3"}) {
    SCOPED_TRACE(model);
    ModelConfig modern = Load(model, "config.json");
    ModelConfig legacy = Load(model, "config_legacy.json");
    EXPECT_EQ(modern, legacy);
    EXPECT_EQ(modern.vocab_size, 1024);
    EXPECT_FALSE(modern.tie_word_embeddings);
    EXPECT_EQ(modern.rms_norm_eps, 1e-5);
    EXPECT_EQ(modern.dtype, "float32");
  }
}

TEST(HfConfigTest, Llama3RopeScaling) {
  ModelConfig c = Load("tiny-llama3", "config.json");
  EXPECT_EQ(c.model_type, "llama");
  EXPECT_EQ(c.architecture, "LlamaForCausalLM");
  EXPECT_EQ(c.num_layers, 3);
  EXPECT_EQ(c.hidden_size, 128);
  EXPECT_EQ(c.num_heads, 8);
  EXPECT_EQ(c.num_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.intermediate_size, 344);
  EXPECT_EQ(c.rope.type, "llama3");
  EXPECT_EQ(c.rope.theta, 5e5);
  EXPECT_EQ(c.rope.factor, 8.0);
  EXPECT_EQ(c.rope.low_freq_factor, 1.0);
  EXPECT_EQ(c.rope.high_freq_factor, 4.0);
  EXPECT_EQ(c.rope.original_max_position_embeddings, 256);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_ids, std::vector<int>{2});
}

TEST(HfConfigTest, Qwen2HasQkvBiasAndQwen3HasQkNorm) {
  ModelConfig q2 = Load("tiny-qwen2", "config.json");
  EXPECT_TRUE(q2.qkv_bias);
  EXPECT_FALSE(q2.o_bias);
  EXPECT_EQ(q2.head_dim, 16);  // derived: 96 / 6
  EXPECT_EQ(q2.rope.type, "default");
  EXPECT_EQ(q2.rope.theta, 1e6);
  ModelConfig q3 = Load("tiny-qwen3", "config.json");
  EXPECT_TRUE(q3.qk_norm);
  EXPECT_FALSE(q3.qkv_bias);
  EXPECT_EQ(q3.head_dim, 32);  // given, != 64 / 4
  EXPECT_EQ(q3.num_kv_heads, 1);
  EXPECT_EQ(q3.sliding_window, 0);
}

json LlamaBase() {
  return json{{"model_type", "llama"},    {"vocab_size", 100},      {"hidden_size", 64},
              {"intermediate_size", 128}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
              {"num_key_value_heads", 2}};
}

TEST(HfConfigTest, DefaultsAndVariants) {
  json j = LlamaBase();
  j["eos_token_id"] = {128001, 128009};
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  j["tie_word_embeddings"] = true;
  ASSERT_OK_AND_ASSIGN(ModelConfig c, ParseHfConfig(j.dump(), "x/config.json"));
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int>{128001, 128009}));
  EXPECT_EQ(c.rope.type, "linear");
  EXPECT_EQ(c.rope.factor, 2.0);
  EXPECT_EQ(c.rope.theta, 10000.0);
  EXPECT_TRUE(c.tie_word_embeddings);
  j = LlamaBase();
  j["model_type"] = "mistral";
  j["sliding_window"] = 4096;
  ASSERT_OK_AND_ASSIGN(ModelConfig m, ParseHfConfig(j.dump(), "x"));
  EXPECT_EQ(m.sliding_window, 4096);
  j = LlamaBase();
  j["attention_bias"] = true;
  ASSERT_OK_AND_ASSIGN(ModelConfig b, ParseHfConfig(j.dump(), "x"));
  EXPECT_TRUE(b.qkv_bias);
  EXPECT_TRUE(b.o_bias);
}

TEST(HfConfigTest, BadConfigsNameFileAndField) {
  struct Case {
    std::function<void(json&)> edit;
    const char* message;
  };
  std::vector<Case> cases = {
      {[](json& j) { j["model_type"] = "gpt2"; },
       "field 'model_type' 'gpt2' is not a supported architecture"},
      {[](json& j) { j.erase("model_type"); }, "'model_type' '' is not a supported"},
      {[](json& j) { j.erase("hidden_size"); }, "field 'hidden_size' is required"},
      {[](json& j) { j["vocab_size"] = "big"; }, "field 'vocab_size' must be an integer"},
      {[](json& j) { j["num_key_value_heads"] = 3; }, "(3) must divide num_attention_heads (4)"},
      {[](json& j) { j["hidden_size"] = 66; }, "not divisible by num_attention_heads"},
      {[](json& j) {
         j["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
       },
       "'yarn' is not supported"},
      {[](json& j) {
         j["rope_scaling"] = {{"rope_type", "llama3"},
                              {"factor", 8.0},
                              {"low_freq_factor", 4.0},
                              {"high_freq_factor", 1.0}};
       },
       "high_freq_factor"},
      {[](json& j) { j["hidden_act"] = "gelu"; }, "'gelu' is not supported"},
      {[](json& j) { j["num_hidden_layers"] = 0; }, "num_hidden_layers' must be in [1, 2^30]"},
      {[](json& j) { j["eos_token_id"] = "x"; }, "eos_token_id"},
  };
  for (const Case& c : cases) {
    json j = LlamaBase();
    c.edit(j);
    EXPECT_THAT(ParseHfConfig(j.dump(), "m/config.json"),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         ::testing::AllOf(HasSubstr("m/config.json"), HasSubstr(c.message))))
        << j.dump();
  }
  EXPECT_THAT(ParseHfConfig("[1, 2", "m/config.json"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a JSON object")));
  EXPECT_THAT(LoadHfConfig("/nonexistent/dir"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("/nonexistent")));
}

}  // namespace
}  // namespace kvserve
