#include "common/model/hf_config.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "common/string_util.h"
#include "nlohmann/json.hpp"

namespace kvserve {
namespace {

using json = nlohmann::json;

// Reads typed fields from one JSON object and reports errors as "<source>: field 'x' ...".
class FieldReader {
 public:
  FieldReader(const json& object, std::string_view source) : object_(object), source_(source) {}

  absl::Status Error(std::string_view field, std::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat(Sv(source_), ": field '", Sv(field), "' ", Sv(what)));
  }

  bool Has(const char* field) const {
    auto it = object_.find(field);
    return it != object_.end() && !it->is_null();
  }

  absl::StatusOr<int64_t> Int(const char* field, std::optional<int64_t> fallback) const {
    if (!Has(field)) {
      if (fallback) return *fallback;
      return Error(field, "is required");
    }
    const json& v = object_.at(field);
    if (!v.is_number_integer()) return Error(field, "must be an integer");
    return v.get<int64_t>();
  }

  absl::StatusOr<int> PositiveInt(const char* field, std::optional<int64_t> fallback = {}) const {
    ASSIGN_OR_RETURN(int64_t v, Int(field, fallback));
    if (v <= 0 || v > (int64_t{1} << 30)) {
      return Error(field, absl::StrCat("must be in [1, 2^30], got ", v));
    }
    return static_cast<int>(v);
  }

  absl::StatusOr<double> Double(const char* field, double fallback) const {
    if (!Has(field)) return fallback;
    const json& v = object_.at(field);
    if (!v.is_number()) return Error(field, "must be a number");
    return v.get<double>();
  }

  absl::StatusOr<bool> Bool(const char* field, bool fallback) const {
    if (!Has(field)) return fallback;
    const json& v = object_.at(field);
    if (!v.is_boolean()) return Error(field, "must be true or false");
    return v.get<bool>();
  }

  absl::StatusOr<std::string> String(const char* field) const {
    if (!Has(field)) return std::string();
    const json& v = object_.at(field);
    if (!v.is_string()) return Error(field, "must be a string");
    return v.get<std::string>();
  }

 private:
  const json& object_;
  std::string_view source_;
};

// The rope settings live in `rope_parameters` (transformers 5: theta inside) or in the legacy
// top-level `rope_theta` plus an optional `rope_scaling` object (type under `rope_type` or
// the older `type`).
absl::StatusOr<RopeConfig> ParseRope(const json& root, std::string_view source) {
  FieldReader top(root, source);
  RopeConfig rope;
  const json* params = nullptr;
  std::string params_name;
  if (top.Has("rope_parameters")) {
    params = &root.at("rope_parameters");
    params_name = "rope_parameters";
  } else if (top.Has("rope_scaling")) {
    params = &root.at("rope_scaling");
    params_name = "rope_scaling";
  }
  ASSIGN_OR_RETURN(rope.theta, top.Double("rope_theta", 10000.0));
  if (params == nullptr) return rope;
  if (!params->is_object()) return top.Error(params_name, "must be an object");
  std::string sub_source = absl::StrCat(Sv(source), " ", params_name);
  FieldReader p(*params, sub_source);
  ASSIGN_OR_RETURN(rope.theta, p.Double("rope_theta", rope.theta));
  ASSIGN_OR_RETURN(std::string type, p.String("rope_type"));
  if (type.empty()) {
    ASSIGN_OR_RETURN(type, p.String("type"));
  }
  if (!type.empty()) rope.type = type;
  if (rope.type != "default" && rope.type != "linear" && rope.type != "llama3") {
    return p.Error("rope_type",
                   absl::StrCat("'", rope.type, "' is not supported (default, linear, llama3)"));
  }
  ASSIGN_OR_RETURN(rope.factor, p.Double("factor", 1.0));
  if (rope.type != "default" && !(rope.factor >= 1.0)) {
    return p.Error("factor", absl::StrCat("must be >= 1, got ", rope.factor));
  }
  if (rope.type == "llama3") {
    ASSIGN_OR_RETURN(rope.low_freq_factor, p.Double("low_freq_factor", 1.0));
    ASSIGN_OR_RETURN(rope.high_freq_factor, p.Double("high_freq_factor", 4.0));
    ASSIGN_OR_RETURN(rope.original_max_position_embeddings,
                     p.PositiveInt("original_max_position_embeddings", 8192));
    if (!(rope.high_freq_factor > rope.low_freq_factor)) {
      return p.Error("high_freq_factor", "must be greater than low_freq_factor");
    }
  }
  if (!(rope.theta > 0)) return p.Error("rope_theta", "must be positive");
  return rope;
}

absl::StatusOr<std::vector<int>> ParseEos(const json& root, std::string_view source) {
  std::vector<int> out;
  auto it = root.find("eos_token_id");
  if (it == root.end() || it->is_null()) return out;
  auto add = [&](const json& v) -> absl::Status {
    if (!v.is_number_integer() || v.get<int64_t>() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(Sv(source), ": field 'eos_token_id' must hold non-negative integers"));
    }
    out.push_back(v.get<int>());
    return absl::OkStatus();
  };
  if (it->is_array()) {
    for (const json& v : *it) RETURN_IF_ERROR(add(v));
  } else {
    RETURN_IF_ERROR(add(*it));
  }
  return out;
}

// The attention heads: their number, the KV heads' (which must divide it) and their size.
absl::Status ParseHeads(FieldReader& r, ModelConfig& c) {
  ASSIGN_OR_RETURN(c.num_heads, r.PositiveInt("num_attention_heads"));
  ASSIGN_OR_RETURN(c.num_kv_heads, r.PositiveInt("num_key_value_heads", c.num_heads));
  if (c.num_heads % c.num_kv_heads != 0) {
    return r.Error(
        "num_key_value_heads",
        absl::StrCat("(", c.num_kv_heads, ") must divide num_attention_heads (", c.num_heads, ")"));
  }
  if (r.Has("head_dim")) {
    ASSIGN_OR_RETURN(c.head_dim, r.PositiveInt("head_dim"));
  } else {
    if (c.hidden_size % c.num_heads != 0) {
      return r.Error("head_dim",
                     absl::StrCat("is absent and hidden_size (", c.hidden_size,
                                  ") is not divisible by num_attention_heads (", c.num_heads, ")"));
    }
    c.head_dim = c.hidden_size / c.num_heads;
  }
  if (c.head_dim % 2 != 0) return r.Error("head_dim", "must be even for rotary embeddings");
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelConfig> ParseHfConfig(std::string_view json_text, std::string_view source) {
  json root = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(Sv(source), ": not a JSON object"));
  }
  FieldReader r(root, source);
  ModelConfig c;
  ASSIGN_OR_RETURN(c.model_type, r.String("model_type"));
  if (c.model_type != "llama" && c.model_type != "mistral" && c.model_type != "qwen2" &&
      c.model_type != "qwen3") {
    return r.Error("model_type", absl::StrCat("'", c.model_type,
                                              "' is not a supported architecture (llama, mistral, "
                                              "qwen2, qwen3)"));
  }
  if (r.Has("architectures")) {
    const json& a = root.at("architectures");
    if (!a.is_array() || (!a.empty() && !a[0].is_string())) {
      return r.Error("architectures", "must be a list of strings");
    }
    if (!a.empty()) c.architecture = a[0].get<std::string>();
  }
  ASSIGN_OR_RETURN(c.vocab_size, r.PositiveInt("vocab_size"));
  ASSIGN_OR_RETURN(c.hidden_size, r.PositiveInt("hidden_size"));
  ASSIGN_OR_RETURN(c.intermediate_size, r.PositiveInt("intermediate_size"));
  ASSIGN_OR_RETURN(c.num_layers, r.PositiveInt("num_hidden_layers"));
  RETURN_IF_ERROR(ParseHeads(r, c));
  ASSIGN_OR_RETURN(c.rms_norm_eps, r.Double("rms_norm_eps", 1e-6));
  if (!(c.rms_norm_eps > 0)) return r.Error("rms_norm_eps", "must be positive");
  ASSIGN_OR_RETURN(c.max_position_embeddings, r.Int("max_position_embeddings", 4096));
  if (c.max_position_embeddings <= 0) return r.Error("max_position_embeddings", "must be positive");

  ASSIGN_OR_RETURN(bool attention_bias, r.Bool("attention_bias", false));
  if (c.model_type == "qwen2") {
    c.qkv_bias = true;  // Qwen2 always has q/k/v biases and no output bias.
  } else if (c.model_type != "mistral") {
    c.qkv_bias = attention_bias;
    c.o_bias = attention_bias;
  }
  ASSIGN_OR_RETURN(c.mlp_bias, r.Bool("mlp_bias", false));
  c.qk_norm = c.model_type == "qwen3";
  ASSIGN_OR_RETURN(c.tie_word_embeddings, r.Bool("tie_word_embeddings", false));

  ASSIGN_OR_RETURN(std::string act, r.String("hidden_act"));
  if (!act.empty() && act != "silu") {
    return r.Error("hidden_act", absl::StrCat("'", act, "' is not supported (silu)"));
  }
  bool sliding = c.model_type == "mistral";
  if (c.model_type == "qwen2" || c.model_type == "qwen3") {
    ASSIGN_OR_RETURN(sliding, r.Bool("use_sliding_window", false));
  }
  if (sliding && r.Has("sliding_window")) {
    ASSIGN_OR_RETURN(c.sliding_window, r.PositiveInt("sliding_window"));
  }

  ASSIGN_OR_RETURN(c.dtype, r.String("dtype"));
  if (c.dtype.empty()) {
    ASSIGN_OR_RETURN(c.dtype, r.String("torch_dtype"));
  }
  ASSIGN_OR_RETURN(int64_t bos, r.Int("bos_token_id", -1));
  c.bos_token_id = static_cast<int>(bos);
  ASSIGN_OR_RETURN(c.eos_token_ids, ParseEos(root, source));
  ASSIGN_OR_RETURN(c.rope, ParseRope(root, source));
  return c;
}

absl::StatusOr<ModelConfig> LoadHfConfig(const std::string& path) {
  std::string file = path;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    file = (std::filesystem::path(path) / "config.json").string();
  }
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(file));
  return ParseHfConfig(text, file);
}

}  // namespace kvserve
