// kvserve-make-model: writes a small Llama-architecture checkpoint with random weights in
// Hugging Face layout (config.json, generation_config.json, model.safetensors), sized to a
// real tokenizer's vocabulary and shipping that tokenizer, so the whole serving path (chat
// template, tokenizer, engine, detokenizer) runs end to end without downloading a model.
// Its answers are random text: it is a plumbing model, not a language model.
//
//   kvserve-make-model --tokenizer models/llama3-tokenizer --out models/kvserve-tiny-llama3
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/init.h"
#include "common/safetensors.h"
#include "common/status_macros.h"
#include "common/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, out, "", "Output directory (created)");
ABSL_FLAG(std::string, tokenizer, "",
          "Directory with tokenizer.json and tokenizer_config.json to ship");
ABSL_FLAG(int32_t, hidden_size, 64, "Hidden size");
ABSL_FLAG(int32_t, num_layers, 2, "Decoder layers");
ABSL_FLAG(int32_t, num_heads, 4, "Attention heads");
ABSL_FLAG(int32_t, num_kv_heads, 2, "KV heads");
ABSL_FLAG(int32_t, intermediate_size, 192, "MLP intermediate size");
ABSL_FLAG(int32_t, max_position_embeddings, 8192, "Longest context");
ABSL_FLAG(uint64_t, seed, 0, "Random seed for the weights");

namespace kvserve {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

uint16_t ToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  bits += 0x7fff + ((bits >> 16) & 1);  // round to nearest even
  return static_cast<uint16_t>(bits >> 16);
}

absl::Status Make() {
  const std::string out = absl::GetFlag(FLAGS_out);
  const std::string tok_dir = absl::GetFlag(FLAGS_tokenizer);
  if (out.empty() || tok_dir.empty())
    return absl::InvalidArgumentError("--out and --tokenizer are required");
  ASSIGN_OR_RETURN(auto tok, tokenizer::Tokenizer::FromDirectory(tok_dir));
  const int vocab = tok->vocab_size();
  const int h = absl::GetFlag(FLAGS_hidden_size), layers = absl::GetFlag(FLAGS_num_layers);
  const int heads = absl::GetFlag(FLAGS_num_heads), kv_heads = absl::GetFlag(FLAGS_num_kv_heads);
  const int inter = absl::GetFlag(FLAGS_intermediate_size);
  if (h <= 0 || layers <= 0 || heads <= 0 || kv_heads <= 0 || inter <= 0 || h % heads != 0 ||
      heads % kv_heads != 0) {
    return absl::InvalidArgumentError(
        "sizes must be positive, hidden divisible by heads, heads by KV heads");
  }
  const int head_dim = h / heads;
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", out, ": ", ec.message()));

  std::vector<int> eos;
  if (tok->eos_id()) eos.push_back(*tok->eos_id());
  if (auto eot = tok->TokenToId("<|eot_id|>")) eos.push_back(*eot);
  json config = {{"architectures", {"LlamaForCausalLM"}},
                 {"model_type", "llama"},
                 {"vocab_size", vocab},
                 {"hidden_size", h},
                 {"intermediate_size", inter},
                 {"num_hidden_layers", layers},
                 {"num_attention_heads", heads},
                 {"num_key_value_heads", kv_heads},
                 {"head_dim", head_dim},
                 {"hidden_act", "silu"},
                 {"max_position_embeddings", absl::GetFlag(FLAGS_max_position_embeddings)},
                 {"rms_norm_eps", 1e-5},
                 {"tie_word_embeddings", false},
                 {"dtype", "bfloat16"},
                 {"bos_token_id", tok->bos_id().value_or(0)},
                 {"eos_token_id", eos},
                 {"rope_parameters",
                  {{"rope_type", "llama3"},
                   {"rope_theta", 500000.0},
                   {"factor", 8.0},
                   {"low_freq_factor", 1.0},
                   {"high_freq_factor", 4.0},
                   {"original_max_position_embeddings", 8192}}}};
  std::ofstream(fs::path(out) / "config.json") << config.dump(2) << "\n";
  std::ofstream(fs::path(out) / "generation_config.json")
      << json{{"bos_token_id", tok->bos_id().value_or(0)}, {"eos_token_id", eos}}.dump(2) << "\n";
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
    fs::copy_file(fs::path(tok_dir) / f, fs::path(out) / f, fs::copy_options::overwrite_existing,
                  ec);
    if (ec) return absl::InternalError(absl::StrCat("cannot copy ", f, ": ", ec.message()));
  }

  std::mt19937_64 rng(absl::GetFlag(FLAGS_seed));
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<std::string> storage;
  std::vector<TensorToWrite> tensors;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, bool ones) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::string bytes(n * 2, '\0');
    for (int64_t i = 0; i < n; ++i) {
      uint16_t v = ToBf16(ones ? 1.0f : normal(rng));
      bytes[2 * i] = static_cast<char>(v & 0xff);
      bytes[2 * i + 1] = static_cast<char>(v >> 8);
    }
    storage.push_back(std::move(bytes));
    tensors.push_back({name, DType::kBF16, std::move(shape), {}});
  };
  add("model.embed_tokens.weight", {vocab, h}, false);
  for (int l = 0; l < layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    add(p + "input_layernorm.weight", {h}, true);
    add(p + "self_attn.q_proj.weight", {heads * head_dim, h}, false);
    add(p + "self_attn.k_proj.weight", {kv_heads * head_dim, h}, false);
    add(p + "self_attn.v_proj.weight", {kv_heads * head_dim, h}, false);
    add(p + "self_attn.o_proj.weight", {h, heads * head_dim}, false);
    add(p + "post_attention_layernorm.weight", {h}, true);
    add(p + "mlp.gate_proj.weight", {inter, h}, false);
    add(p + "mlp.up_proj.weight", {inter, h}, false);
    add(p + "mlp.down_proj.weight", {h, inter}, false);
  }
  add("model.norm.weight", {h}, true);
  add("lm_head.weight", {vocab, h}, false);
  for (size_t i = 0; i < tensors.size(); ++i) tensors[i].bytes = storage[i];
  return WriteSafetensors((fs::path(out) / "model.safetensors").string(), tensors,
                          {{"format", "pt"}, {"kvserve", "random weights (kvserve-make-model)"}});
}

}  // namespace
}  // namespace kvserve

int main(int argc, char** argv) {
  kvserve::InitProgram(
      argc, argv, "kvserve-make-model --tokenizer DIR --out DIR: a random-weight Llama checkpoint");
  absl::Status s = kvserve::Make();
  if (!s.ok()) {
    std::cerr << "kvserve-make-model: " << s.message() << "\n";
    return 1;
  }
  return 0;
}
