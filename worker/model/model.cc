#include "worker/model/model.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/model_weights.h"
#include "common/safetensors.h"
#include "common/status_macros.h"
#include "kernels/rope.h"

namespace kvserve::worker {
namespace {

// Loads a tensor as float32, appending to `out` (so fused weights concatenate rows).
absl::Status Append(const Checkpoint& ckpt, const std::string& name, std::vector<float>* out) {
  ASSIGN_OR_RETURN(const TensorInfo* t, ckpt.Find(name));
  std::vector<float> v = t->ToFloat32();
  out->insert(out->end(), v.begin(), v.end());
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> Model::Load(const std::string& dir,
                                                   const ModelConfig& config,
                                                   kernels::Backend* backend) {
  ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt, Checkpoint::Open(dir));
  RETURN_IF_ERROR(CheckWeights(config, *ckpt));
  std::unique_ptr<Model> m(new Model(config, backend));
  RETURN_IF_ERROR(Append(*ckpt, "model.embed_tokens.weight", &m->embed_));
  RETURN_IF_ERROR(Append(*ckpt, "model.norm.weight", &m->final_norm_));
  if (!config.tie_word_embeddings) RETURN_IF_ERROR(Append(*ckpt, "lm_head.weight", &m->lm_head_));
  m->layers_.resize(config.num_layers);
  for (int l = 0; l < config.num_layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    Layer& L = m->layers_[l];
    RETURN_IF_ERROR(Append(*ckpt, p + "input_layernorm.weight", &L.input_norm));
    RETURN_IF_ERROR(Append(*ckpt, p + "post_attention_layernorm.weight", &L.post_norm));
    for (const char* proj : {"q_proj", "k_proj", "v_proj"}) {
      RETURN_IF_ERROR(Append(*ckpt, absl::StrCat(p, "self_attn.", proj, ".weight"), &L.qkv));
      if (config.qkv_bias) {
        RETURN_IF_ERROR(Append(*ckpt, absl::StrCat(p, "self_attn.", proj, ".bias"), &L.qkv_bias));
      }
    }
    if (config.qk_norm) {
      RETURN_IF_ERROR(Append(*ckpt, p + "self_attn.q_norm.weight", &L.q_norm));
      RETURN_IF_ERROR(Append(*ckpt, p + "self_attn.k_norm.weight", &L.k_norm));
    }
    RETURN_IF_ERROR(Append(*ckpt, p + "self_attn.o_proj.weight", &L.o));
    if (config.o_bias) RETURN_IF_ERROR(Append(*ckpt, p + "self_attn.o_proj.bias", &L.o_bias));
    RETURN_IF_ERROR(Append(*ckpt, p + "mlp.gate_proj.weight", &L.gate_up));
    RETURN_IF_ERROR(Append(*ckpt, p + "mlp.up_proj.weight", &L.gate_up));
    RETURN_IF_ERROR(Append(*ckpt, p + "mlp.down_proj.weight", &L.down));
    if (config.mlp_bias) {
      RETURN_IF_ERROR(Append(*ckpt, p + "mlp.gate_proj.bias", &L.gate_up_bias));
      RETURN_IF_ERROR(Append(*ckpt, p + "mlp.up_proj.bias", &L.gate_up_bias));
      RETURN_IF_ERROR(Append(*ckpt, p + "mlp.down_proj.bias", &L.down_bias));
    }
  }
  auto bytes = [](const std::vector<float>& v) { return static_cast<int64_t>(v.size() * sizeof(float)); };
  m->weight_bytes_ = bytes(m->embed_) + bytes(m->final_norm_) + bytes(m->lm_head_);
  for (const Layer& L : m->layers_) {
    for (const auto* v : {&L.input_norm, &L.post_norm, &L.qkv, &L.qkv_bias, &L.q_norm, &L.k_norm, &L.o,
                          &L.o_bias, &L.gate_up, &L.gate_up_bias, &L.down, &L.down_bias}) {
      m->weight_bytes_ += bytes(*v);
    }
  }
  m->inv_freq_ = kernels::RopeInvFreq(config.rope, config.head_dim);
  return m;
}

std::vector<float> Model::Forward(const ForwardBatch& b, KvStorage& kv) {
  const ModelConfig& c = config_;
  const int64_t T = static_cast<int64_t>(b.token_ids.size());
  const int64_t H = c.hidden_size, D = c.head_dim;
  const int64_t q_dim = int64_t{c.num_heads} * D, kv_dim = int64_t{c.num_kv_heads} * D;
  const int64_t qkv_dim = q_dim + 2 * kv_dim, inter = c.intermediate_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  std::vector<float> delta(T * H), residual(T * H, 0.0f), h(T * H), qkv(T * qkv_dim),
      attn(T * q_dim), gate_up(T * 2 * inter), act(T * inter);

  backend_->Embedding({b.token_ids.data(), embed_.data(), delta.data(), T, H});
  for (int l = 0; l < c.num_layers; ++l) {
    Layer& L = layers_[l];
    backend_->RmsNorm({delta.data(), residual.data(), L.input_norm.data(), h.data(), T, H, eps});
    backend_->Gemm({h.data(), L.qkv.data(), L.qkv_bias.empty() ? nullptr : L.qkv_bias.data(),
                    qkv.data(), T, qkv_dim, H});
    if (c.qk_norm) {
      for (int64_t t = 0; t < T; ++t) {
        float* row = qkv.data() + t * qkv_dim;
        backend_->RmsNorm({row, nullptr, L.q_norm.data(), row, c.num_heads, D, eps});
        backend_->RmsNorm({row + q_dim, nullptr, L.k_norm.data(), row + q_dim, c.num_kv_heads, D, eps});
      }
    }
    backend_->Rope({qkv.data(), b.positions.data(), inv_freq_.data(), T, c.num_heads, D, qkv_dim});
    backend_->Rope({qkv.data() + q_dim, b.positions.data(), inv_freq_.data(), T, c.num_kv_heads, D,
                    qkv_dim});
    const kernels::KvCacheView cache = kv.View(l);
    backend_->WriteKv({qkv.data() + q_dim, qkv.data() + q_dim + kv_dim, qkv_dim,
                       b.slot_mapping.data(), T, cache});
    kernels::PagedAttentionParams ap;
    ap.q = qkv.data();
    ap.q_stride = qkv_dim;
    ap.out = attn.data();
    ap.cache = cache;
    ap.query_start = b.query_start.data();
    ap.query_len = b.query_len.data();
    ap.context_len = b.context_len.data();
    ap.block_tables = b.block_tables.data();
    ap.num_seqs = static_cast<int64_t>(b.query_start.size());
    ap.max_blocks_per_seq = b.max_blocks_per_seq;
    ap.num_heads = c.num_heads;
    ap.scale = 1.0f / std::sqrt(static_cast<float>(D));
    backend_->PagedAttention(ap);
    backend_->Gemm({attn.data(), L.o.data(), L.o_bias.empty() ? nullptr : L.o_bias.data(),
                    delta.data(), T, H, q_dim});
    backend_->RmsNorm({delta.data(), residual.data(), L.post_norm.data(), h.data(), T, H, eps});
    backend_->Gemm({h.data(), L.gate_up.data(),
                    L.gate_up_bias.empty() ? nullptr : L.gate_up_bias.data(), gate_up.data(), T,
                    2 * inter, H});
    backend_->SiluMul({gate_up.data(), act.data(), T, inter});
    backend_->Gemm({act.data(), L.down.data(), L.down_bias.empty() ? nullptr : L.down_bias.data(),
                    delta.data(), T, H, inter});
  }
  backend_->RmsNorm({delta.data(), residual.data(), final_norm_.data(), h.data(), T, H, eps});

  const int64_t R = static_cast<int64_t>(b.logit_rows.size());
  std::vector<float> selected(R * H);
  for (int64_t r = 0; r < R; ++r) {
    std::copy_n(h.data() + int64_t{b.logit_rows[r]} * H, H, selected.data() + r * H);
  }
  std::vector<float> logits(R * c.vocab_size);
  const std::vector<float>& head = c.tie_word_embeddings ? embed_ : lm_head_;
  backend_->Gemm({selected.data(), head.data(), nullptr, logits.data(), R, c.vocab_size, H});
  return logits;
}

}  // namespace kvserve::worker
