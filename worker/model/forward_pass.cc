// Model's forward pass (model.h): RunModel's ops from the embeddings to the logits, each layer
// as the backend's RmsNorm, Gemm and SiluMul, or as DecodeGemv for the steps it serves.
#include <cmath>
#include <cstdint>

#include "common/status_macros.h"
#include "worker/model/model.h"

namespace kvserve::worker {
namespace {

// Null for an empty (absent) tensor.
const float* OrNull(const kernels::Buffer<float>& b) { return b.empty() ? nullptr : b.data(); }

}  // namespace

absl::StatusOr<const float*> Model::RunModel(const StepInputs& in, KvStorage& kv) {
  const ModelConfig& c = config_;
  const int64_t T = in.tokens;
  const int64_t H = c.hidden_size, D = c.head_dim;
  const int64_t q_dim = int64_t{heads_} * D, kv_dim = int64_t{kv_heads_} * D;
  const int64_t qkv_dim = q_dim + 2 * kv_dim, inter = inter_;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const Activations a = ReserveActivations(T);
  float *delta = a.delta, *residual = a.residual, *h = a.h, *qkv = a.qkv, *attn = a.attn,
        *gate_up = a.gate_up, *act = a.act;
  uint16_t *h16 = a.h16, *attn16 = a.attn16, *act16 = a.act16;
  // With 16-bit weights, the norms before the projections, attention and the MLP's activation
  // write the Gemms' inputs already rounded to the weights' type (h16, attn16, act16): bit for
  // bit what the Gemm would round them to, and on CUDA one launch fewer per Gemm.
  auto norm = [&](const float* x, float* res, const kernels::Buffer<float>& weight) {
    backend_->RmsNorm({.x = x,
                       .residual = res,
                       .weight = weight.data(),
                       .out = h16 != nullptr ? nullptr : h,
                       .rows = T,
                       .hidden = H,
                       .eps = eps,
                       .out16 = h16,
                       .out16_type = weight_type_});
  };

  // y[m, n] = x[m, k] · w[n, k]ᵀ (+ bias), x given in float and (x16) rounded to the weights.
  const auto gemm = [&](const float* x, const uint16_t* x16, const Matrix& w,
                        const kernels::Buffer<float>& bias, float* y, int64_t n, int64_t k) {
    backend_->Gemm({.x = x,
                    .w = w.data(),
                    .bias = OrNull(bias),
                    .y = y,
                    .m = T,
                    .n = n,
                    .k = k,
                    .w_type = weight_type_,
                    .x16 = x16});
  };
  backend_->Embedding({.ids = in.token_ids,
                       .table = embed_.data(),
                       .out = delta,
                       .num_tokens = T,
                       .hidden = H,
                       .table_type = weight_type_});
  if (UsesDecodeGemv(T)) {
    ASSIGN_OR_RETURN(residual, RunLayersGemv(in, kv, a));
  } else {
    for (int l = 0; l < c.num_layers; ++l) {
      Layer& L = layers_[l];
      if (l == 0) {  // the residual stream starts as the embeddings
        backend_->Copy(residual, delta, sizeof(float) * T * H);
        norm(residual, nullptr, L.input_norm);
      } else {
        norm(delta, residual, L.input_norm);
      }
      gemm(h, h16, L.qkv, L.qkv_bias, qkv, qkv_dim, H);
      const kernels::KvCacheView cache = kv.View(l);
      RotateAndStore(in, L, cache, qkv);
      if (after_kv_write_ != nullptr) (*after_kv_write_)(shard_.rank, l);
      Attend(in, cache, qkv, qkv_dim, attn, attn16);
      gemm(attn, attn16, L.o, L.o_bias, delta, H, q_dim);
      if (comm_ != nullptr) RETURN_IF_ERROR(AllReduce(delta, T * H));
      norm(delta, residual, L.post_norm);
      gemm(h, h16, L.gate_up, L.gate_up_bias, gate_up, 2 * inter, H);
      backend_->SiluMul({.gate_up = gate_up,
                         .out = act,
                         .num_tokens = T,
                         .inter = inter,
                         .out16 = act16,
                         .out16_type = weight_type_});
      gemm(act, act16, L.down, L.down_bias, delta, H, inter);
      if (comm_ != nullptr) RETURN_IF_ERROR(AllReduce(delta, T * H));
    }
  }
  backend_->RmsNorm({.x = delta,
                     .residual = residual,
                     .weight = final_norm_.data(),
                     .out = h,
                     .rows = T,
                     .hidden = H,
                     .eps = eps});
  return Logits(in, h);
}

bool Model::UsesDecodeGemv(int64_t tokens) const {
  const int64_t q_dim = int64_t{heads_} * config_.head_dim;
  return weight_type_ != DType::kF32 && tokens > 0 &&
         tokens <= backend_->DecodeGemvRows(config_.hidden_size) && q_dim % 8 == 0 &&
         inter_ % 8 == 0;
}

absl::StatusOr<float*> Model::RunLayersGemv(const StepInputs& in, KvStorage& kv,
                                            const Activations& a) {
  const ModelConfig& c = config_;
  const int64_t T = in.tokens, H = c.hidden_size, D = c.head_dim;
  const int64_t q_dim = int64_t{heads_} * D, qkv_dim = q_dim + 2 * int64_t{kv_heads_} * D;
  const float eps = static_cast<float>(c.rms_norm_eps);
  // The residual stream alternates between two buffers, since every thread block of a
  // normalizing DecodeGemv reads it while one writes the sum; the embeddings start it.
  float* residual_in = nullptr;
  float* residual_out = a.residual;
  const auto gemv = [&](const kernels::Buffer<float>* norm, const uint16_t* x16, const Matrix& w,
                        const kernels::Buffer<float>& bias, float* y, uint16_t* out16, int64_t n,
                        int64_t k) {
    kernels::DecodeGemvParams p{.x16 = x16,
                                .w = w.data(),
                                .w_type = weight_type_,
                                .bias = OrNull(bias),
                                .m = T,
                                .n = n,
                                .k = k,
                                .y = y,
                                .silu_mul = out16 != nullptr,
                                .out16 = out16};
    if (norm != nullptr) {
      p.norm = {.x = a.delta,
                .residual_in = residual_in,
                .residual_out = residual_out,
                .weight = norm->data(),
                .eps = eps};
      residual_in = residual_out;
      residual_out = residual_out == a.residual ? a.residual_alt : a.residual;
    }
    backend_->DecodeGemv(p);
  };
  for (int l = 0; l < c.num_layers; ++l) {
    Layer& L = layers_[l];
    gemv(&L.input_norm, nullptr, L.qkv, L.qkv_bias, a.qkv, nullptr, qkv_dim, H);
    const kernels::KvCacheView cache = kv.View(l);
    RotateAndStore(in, L, cache, a.qkv);
    if (after_kv_write_ != nullptr) (*after_kv_write_)(shard_.rank, l);
    Attend(in, cache, a.qkv, qkv_dim, a.attn, a.attn16);
    gemv(nullptr, a.attn16, L.o, L.o_bias, a.delta, nullptr, H, q_dim);
    if (comm_ != nullptr) RETURN_IF_ERROR(AllReduce(a.delta, T * H));
    gemv(&L.post_norm, nullptr, L.gate_up, L.gate_up_bias, nullptr, a.act16, inter_, H);
    gemv(nullptr, a.act16, L.down, L.down_bias, a.delta, nullptr, H, inter_);
    if (comm_ != nullptr) RETURN_IF_ERROR(AllReduce(a.delta, T * H));
  }
  return residual_in;
}

void Model::RotateAndStore(const StepInputs& in, const Layer& L, const kernels::KvCacheView& cache,
                           float* qkv) {
  const int64_t T = in.tokens, D = config_.head_dim;
  const int64_t q_dim = int64_t{heads_} * D, kv_dim = int64_t{kv_heads_} * D;
  const int64_t qkv_dim = q_dim + 2 * kv_dim;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  if (config_.qk_norm) {  // per head, over every token's q heads and then its k heads
    const auto head_norm = [&](int64_t offset, const float* weight, int64_t num_heads) {
      backend_->RmsNorm({.x = qkv + offset,
                         .weight = weight,
                         .out = qkv + offset,
                         .rows = T * num_heads,
                         .hidden = D,
                         .eps = eps,
                         .group_rows = num_heads,
                         .group_stride = qkv_dim});
    };
    head_norm(0, L.q_norm.data(), heads_);
    head_norm(q_dim, L.k_norm.data(), kv_heads_);
  }
  // One launch: k rotated on its way into the cache, q rotated in place (attention reads q from
  // the row and k from the cache).
  backend_->WriteKv({.k = qkv + q_dim,
                     .v = qkv + q_dim + kv_dim,
                     .row_stride = qkv_dim,
                     .slot_mapping = in.slot_mapping,
                     .num_tokens = T,
                     .cache = cache,
                     .rope = {.x = qkv,
                              .positions = in.positions,
                              .inv_freq = inv_freq_.data(),
                              .num_tokens = T,
                              .num_heads = heads_,
                              .head_dim = D,
                              .row_stride = qkv_dim}});
}

void Model::Attend(const StepInputs& in, const kernels::KvCacheView& cache, const float* qkv,
                   int64_t qkv_stride, float* attn, uint16_t* attn16) {
  kernels::PagedAttentionParams ap;
  ap.q = qkv;
  ap.q_stride = qkv_stride;
  ap.out = attn;
  ap.out16 = attn16;
  ap.out16_type = weight_type_;
  ap.cache = cache;
  ap.query_start = in.query_start;
  ap.query_len = in.query_len;
  ap.context_len = in.context_len;
  ap.block_tables = in.block_tables;
  ap.num_seqs = in.num_seqs;
  ap.max_blocks_per_seq = in.max_blocks_per_seq;
  ap.num_heads = heads_;
  ap.scale = 1.0f / std::sqrt(static_cast<float>(config_.head_dim));
  ap.max_query_len = in.max_query_len;
  ap.max_context_len = in.max_context_len;
  backend_->PagedAttention(ap);
}

absl::StatusOr<const float*> Model::Logits(const StepInputs& in, const float* h) {
  const int64_t R = in.num_logit_rows, H = config_.hidden_size;
  const LogitBuffers lb = ReserveLogits(R);
  // A row gather: one launch.
  backend_->Embedding(
      {.ids = in.logit_rows, .table = h, .out = lb.selected, .num_tokens = R, .hidden = H});
  const int64_t vs = vocab_shard_;
  const uint8_t* head = lm_head_.empty() ? embed_.data() : lm_head_.data();
  backend_->Gemm({.x = lb.selected,
                  .w = head,
                  .y = lb.local,
                  .m = R,
                  .n = vs,
                  .k = H,
                  .w_type = weight_type_});
  // Vocabulary-parallel LM head: every rank's [R, vs] slice, gathered as [rank][R][vs].
  if (comm_ == nullptr) return lb.local;
  RETURN_IF_ERROR(AllGather(lb.local, R * vs, lb.gathered));
  return lb.gathered;
}

}  // namespace kvserve::worker
