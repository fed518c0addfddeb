#include "common/model/model_weights.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/string_util.h"

namespace kvserve {

std::vector<WeightSpec> ExpectedWeights(const ModelConfig& c) {
  const int64_t h = c.hidden_size;
  const int64_t q = int64_t{c.num_heads} * c.head_dim;
  const int64_t kv = int64_t{c.num_kv_heads} * c.head_dim;
  const int64_t inter = c.intermediate_size;
  std::vector<WeightSpec> out;
  out.push_back({"model.embed_tokens.weight", {c.vocab_size, h}});
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    out.push_back({p + "input_layernorm.weight", {h}});
    out.push_back({p + "self_attn.q_proj.weight", {q, h}});
    out.push_back({p + "self_attn.k_proj.weight", {kv, h}});
    out.push_back({p + "self_attn.v_proj.weight", {kv, h}});
    if (c.qkv_bias) {
      out.push_back({p + "self_attn.q_proj.bias", {q}});
      out.push_back({p + "self_attn.k_proj.bias", {kv}});
      out.push_back({p + "self_attn.v_proj.bias", {kv}});
    }
    if (c.qk_norm) {
      out.push_back({p + "self_attn.q_norm.weight", {c.head_dim}});
      out.push_back({p + "self_attn.k_norm.weight", {c.head_dim}});
    }
    out.push_back({p + "self_attn.o_proj.weight", {h, q}});
    if (c.o_bias) out.push_back({p + "self_attn.o_proj.bias", {h}});
    out.push_back({p + "post_attention_layernorm.weight", {h}});
    out.push_back({p + "mlp.gate_proj.weight", {inter, h}});
    out.push_back({p + "mlp.up_proj.weight", {inter, h}});
    out.push_back({p + "mlp.down_proj.weight", {h, inter}});
    if (c.mlp_bias) {
      out.push_back({p + "mlp.gate_proj.bias", {inter}});
      out.push_back({p + "mlp.up_proj.bias", {inter}});
      out.push_back({p + "mlp.down_proj.bias", {h}});
    }
  }
  out.push_back({"model.norm.weight", {h}});
  if (!c.tie_word_embeddings) out.push_back({"lm_head.weight", {c.vocab_size, h}});
  return out;
}

int64_t NumParams(const ModelConfig& config) {
  int64_t params = 0;
  for (const WeightSpec& w : ExpectedWeights(config)) {
    int64_t n = 1;
    for (int64_t d : w.shape) n *= d;
    params += n;
  }
  return params;
}

absl::Status CheckWeights(const ModelConfig& config, const Checkpoint& checkpoint) {
  for (const WeightSpec& w : ExpectedWeights(config)) {
    absl::StatusOr<const TensorInfo*> t = checkpoint.Find(w.name);
    if (!t.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint lacks tensor '", w.name, "' that the config requires"));
    }
    const TensorInfo& info = **t;
    if (info.shape != w.shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          info.file, ": tensor '", w.name, "' has shape [", absl::StrJoin(info.shape, ", "),
          "], the config requires [", absl::StrJoin(w.shape, ", "), "]"));
    }
    if (info.dtype != DType::kF32 && info.dtype != DType::kF16 && info.dtype != DType::kBF16) {
      return absl::InvalidArgumentError(absl::StrCat(info.file, ": tensor '", w.name,
                                                     "' has dtype ", Sv(DTypeName(info.dtype)),
                                                     "; weights must be F32, F16 or BF16"));
    }
  }
  return absl::OkStatus();
}

}  // namespace kvserve
