#include "tools/random_model.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/model/safetensors.h"
#include "nlohmann/json.hpp"

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

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Fills the bf16 tensors with N(0, 0.02) values (or ones) on every core. Each run of
// kChunk elements draws from its own generator, seeded by (seed, tensor, chunk), so the
// weights depend on the seed only, not on the number of threads.
void FillRandom(uint64_t seed, const std::vector<bool>& ones, std::vector<std::string>* storage) {
  constexpr int64_t kChunk = int64_t{1} << 20;
  struct Work {
    size_t tensor;
    int64_t chunk;
  };
  std::vector<Work> work;
  for (size_t t = 0; t < storage->size(); ++t) {
    const int64_t n = static_cast<int64_t>((*storage)[t].size() / 2);
    for (int64_t c = 0; c * kChunk < n; ++c) work.push_back({t, c});
  }
  std::atomic<size_t> next{0};
  auto run = [&] {
    for (size_t w = next++; w < work.size(); w = next++) {
      const auto [t, c] = work[w];
      char* bytes = (*storage)[t].data();
      const int64_t n = static_cast<int64_t>((*storage)[t].size() / 2);
      std::mt19937_64 rng(SplitMix64(SplitMix64(seed ^ (t << 32)) ^ static_cast<uint64_t>(c)));
      std::normal_distribution<float> normal(0.0f, 0.02f);
      for (int64_t i = c * kChunk; i < std::min(n, (c + 1) * kChunk); ++i) {
        const uint16_t v = ToBf16(ones[t] ? 1.0f : normal(rng));
        bytes[2 * i] = static_cast<char>(v & 0xff);
        bytes[2 * i + 1] = static_cast<char>(v >> 8);
      }
    }
  };
  std::vector<std::thread> threads(std::max(1u, std::thread::hardware_concurrency()) - 1);
  for (auto& th : threads) th = std::thread(run);
  run();
  for (auto& th : threads) th.join();
}

}  // namespace

absl::Status WriteRandomLlama(const RandomModelOptions& o, const std::string& out) {
  const int vocab = o.vocab, h = o.hidden, layers = o.layers, heads = o.heads,
            kv_heads = o.kv_heads, inter = o.intermediate;
  if (vocab <= 0 || h <= 0 || layers <= 0 || heads <= 0 || kv_heads <= 0 || inter <= 0 ||
      h % heads != 0 || heads % kv_heads != 0) {
    return absl::InvalidArgumentError(
        "sizes must be positive, hidden divisible by heads, heads by KV heads");
  }
  const int head_dim = h / heads;
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", out, ": ", ec.message()));
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
                 {"max_position_embeddings", o.max_position_embeddings},
                 {"rms_norm_eps", 1e-5},
                 {"tie_word_embeddings", false},
                 {"dtype", "bfloat16"},
                 {"bos_token_id", o.bos_id},
                 {"eos_token_id", o.eos_ids},
                 {"rope_parameters",
                  {{"rope_type", "llama3"},
                   {"rope_theta", 500000.0},
                   {"factor", 8.0},
                   {"low_freq_factor", 1.0},
                   {"high_freq_factor", 4.0},
                   {"original_max_position_embeddings", 8192}}}};
  std::ofstream(fs::path(out) / "config.json") << config.dump(2) << "\n";
  std::ofstream(fs::path(out) / "generation_config.json")
      << json{{"bos_token_id", o.bos_id}, {"eos_token_id", o.eos_ids}}.dump(2) << "\n";

  std::vector<std::string> storage;
  std::vector<bool> ones;
  std::vector<TensorToWrite> tensors;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, bool is_ones) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    storage.emplace_back(n * 2, '\0');
    ones.push_back(is_ones);
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
  FillRandom(o.seed, ones, &storage);
  for (size_t i = 0; i < tensors.size(); ++i) tensors[i].bytes = storage[i];
  return WriteSafetensors((fs::path(out) / "model.safetensors").string(), tensors,
                          {{"format", "pt"}, {"kvserve", "random weights (kvserve-make-model)"}});
}

}  // namespace kvserve
