// The CPU reference backend: plain C++ with float32 accumulation, OpenBLAS for GEMMs.
// Deterministic for a given batch: every output element is reduced in a fixed order.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "glog/logging.h"
#include "kernels/backend.h"
#include "kernels/cpu/kv_ops.h"
#include "kernels/cpu/logits_processing.h"
#include "kernels/cpu/sampling.h"

extern "C" void openblas_set_num_threads(int num_threads);

namespace kvserve::kernels {
namespace {

// Dot product with four independent accumulators (a fixed order, so results stay
// deterministic) that the compiler can keep in vector registers.
inline float Dot(const float* a, const float* b, int64_t n) {
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    for (int k = 0; k < 4; ++k) acc[k] += a[i + k] * b[i + k];
  }
  for (; i < n; ++i) acc[0] += a[i] * b[i];
  return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

// Where a row-wise op writes the row at `offset`: float32 `out`, or, given `out16`, the 16-bit
// values there (RmsNormParams / SiluMulParams' out16), rounded to nearest even.
class Out16 {
 public:
  Out16(float* out, uint16_t* out16, DType type, int64_t offset)
      : out_(out16 == nullptr ? out + offset : nullptr),
        out16_(out16 == nullptr ? nullptr : out16 + offset),
        bf16_(type == DType::kBF16) {
    CHECK(out16 == nullptr || type == DType::kBF16 || type == DType::kF16)
        << "out16_type must be fp16 or bf16, not " << DTypeName(type);
  }
  void Store(int64_t i, float v) {
    if (out16_ == nullptr) {
      out_[i] = v;
    } else {
      out16_[i] = bf16_ ? FloatToBf16(v) : FloatToF16(v);
    }
  }

 private:
  float* out_;
  uint16_t* out16_;
  bool bf16_;
};

// Up to this many rows, Gemm runs one sgemv per row: 3.0-3.4x / 1.8x / 1.4-1.5x faster than
// sgemm at 1 / 2 / 3 rows of a 64 MiB weight, even at 4 (tests/bench/cpu_gemm_bench.cc;
// docs/PERF.md, "The whole engine").
constexpr int64_t kGemvMaxRows = 3;

// The rotary angles of token t's position: cos and sin of position · inv_freq[i].
void RopeAngles(const RopeParams& p, int64_t t, std::vector<float>& cos_v,
                std::vector<float>& sin_v) {
  const float pos = static_cast<float>(p.positions[t]);
  for (size_t i = 0; i < cos_v.size(); ++i) {
    const float angle = pos * p.inv_freq[i];
    cos_v[i] = std::cos(angle);
    sin_v[i] = std::sin(angle);
  }
}

// One head of 2 · cos_v.size() values rotated in place (rotate_half).
void Rotate(float* x, const std::vector<float>& cos_v, const std::vector<float>& sin_v) {
  const size_t half = cos_v.size();
  for (size_t i = 0; i < half; ++i) {
    const float x1 = x[i], x2 = x[i + half];
    x[i] = x1 * cos_v[i] - x2 * sin_v[i];
    x[i + half] = x2 * cos_v[i] + x1 * sin_v[i];
  }
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const CpuBackendOptions& options) {
    openblas_set_num_threads(std::max(1, options.num_threads));
  }

  std::string_view name() const override { return "cpu"; }

  // Zero-filled and committed: every page is written now (calloc's pages are only mapped),
  // so that memory that is not there shows at start-up, not under traffic.
  void* Allocate(size_t bytes) override {
    void* p = std::calloc(std::max<size_t>(bytes, 1), 1);
    CHECK(p != nullptr) << "out of memory allocating " << bytes << " bytes";
    volatile char* page = static_cast<char*>(p);
    for (size_t at = 0; at < bytes; at += 4096) page[at] = 0;
    return p;
  }
  void Free(void* p) override { std::free(p); }
  void* AllocateHost(size_t bytes) override { return Allocate(bytes); }
  void FreeHost(void* p) override { Free(p); }
  void Upload(void* dst, const void* src, size_t bytes) override {
    if (bytes > 0) std::memcpy(dst, src, bytes);
  }
  void Download(void* dst, const void* src, size_t bytes) override {
    if (bytes > 0) std::memcpy(dst, src, bytes);
  }
  void Copy(void* dst, const void* src, size_t bytes) override {
    if (bytes > 0) std::memmove(dst, src, bytes);
  }
  void Synchronize() override {}  // every op has finished when it returns

  void Gemm(const GemmParams& p) override {
    if (p.m == 0 || p.n == 0) return;
    const float* w = static_cast<const float*>(p.w);
    const float* x = p.x;
    CHECK(p.x16 == nullptr || p.w_type != DType::kF32) << "Gemm: x16 needs 16-bit weights";
    if (p.w_type != DType::kF32) {
      // As the CUDA backend does: x rounded to the weights' type, products exact, float32 sums.
      CHECK(p.w_type == DType::kF16 || p.w_type == DType::kBF16)
          << "Gemm: unsupported weight type " << DTypeName(p.w_type);
      const bool bf16 = p.w_type == DType::kBF16;
      const auto* h = static_cast<const uint16_t*>(p.w);
      widened_.resize(p.n * p.k);
      for (int64_t i = 0; i < p.n * p.k; ++i) {
        widened_[i] = bf16 ? Bf16ToFloat(h[i]) : F16ToFloat(h[i]);
      }
      rounded_x_.resize(p.m * p.k);
      for (int64_t i = 0; i < p.m * p.k; ++i) {
        const uint16_t bits = p.x16 != nullptr ? p.x16[i]
                              : bf16           ? FloatToBf16(p.x[i])
                                               : FloatToF16(p.x[i]);
        rounded_x_[i] = bf16 ? Bf16ToFloat(bits) : F16ToFloat(bits);
      }
      w = widened_.data();
      x = rounded_x_.data();
    }
    if (p.m <= kGemvMaxRows) {
      // A few rows (decode at a small batch): one sgemv per row streams the weights once
      // each, where OpenBLAS's sgemm would first copy all of them into its packed panels.
      for (int64_t r = 0; r < p.m; ++r) {
        cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(p.n), static_cast<int>(p.k), 1.0f,
                    w, static_cast<int>(p.k), x + r * p.k, 1, 0.0f, p.y + r * p.n, 1);
      }
    } else {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(p.m),
                  static_cast<int>(p.n), static_cast<int>(p.k), 1.0f, x, static_cast<int>(p.k), w,
                  static_cast<int>(p.k), 0.0f, p.y, static_cast<int>(p.n));
    }
    if (p.bias != nullptr) {
      for (int64_t r = 0; r < p.m; ++r) {
        float* row = p.y + r * p.n;
        for (int64_t c = 0; c < p.n; ++c) row[c] += p.bias[c];
      }
    }
  }

  void Embedding(const EmbeddingParams& p) override {
    for (int64_t t = 0; t < p.num_tokens; ++t) {
      const int64_t row = int64_t{p.ids[t]} * p.hidden;
      float* out = p.out + t * p.hidden;
      if (p.table_type == DType::kF32) {
        std::memcpy(out, static_cast<const float*>(p.table) + row, sizeof(float) * p.hidden);
        continue;
      }
      const uint16_t* src = static_cast<const uint16_t*>(p.table) + row;
      for (int64_t i = 0; i < p.hidden; ++i) {
        out[i] = p.table_type == DType::kBF16 ? Bf16ToFloat(src[i]) : F16ToFloat(src[i]);
      }
    }
  }

  void RmsNorm(const RmsNormParams& p) override {
    CHECK(p.group_rows == 0 || p.residual == nullptr) << "RmsNorm: groups take no residual";
    CHECK(p.out16 == nullptr || p.group_rows == 0) << "RmsNorm: out16 takes no groups";
    for (int64_t r = 0; r < p.rows; ++r) {
      const float* x = p.x + p.RowOffset(r);
      Out16 out(p.out, p.out16, p.out16_type, p.RowOffset(r));
      const float* src = x;
      if (p.residual != nullptr) {
        float* res = p.residual + r * p.hidden;
        for (int64_t i = 0; i < p.hidden; ++i) res[i] += x[i];
        src = res;
      }
      float sum = 0.0f;
      for (int64_t i = 0; i < p.hidden; ++i) sum += src[i] * src[i];
      const float inv = 1.0f / std::sqrt(sum / static_cast<float>(p.hidden) + p.eps);
      for (int64_t i = 0; i < p.hidden; ++i) out.Store(i, p.weight[i] * (src[i] * inv));
    }
  }

  void Rope(const RopeParams& p) override {
    std::vector<float> cos_v(p.head_dim / 2), sin_v(p.head_dim / 2);
    for (int64_t t = 0; t < p.num_tokens; ++t) {
      RopeAngles(p, t, cos_v, sin_v);
      for (int64_t h = 0; h < p.num_heads; ++h) {
        Rotate(p.x + t * p.row_stride + h * p.head_dim, cos_v, sin_v);
      }
    }
  }

  void SiluMul(const SiluMulParams& p) override {
    for (int64_t t = 0; t < p.num_tokens; ++t) {
      const float* gate = p.gate_up + t * 2 * p.inter;
      const float* up = gate + p.inter;
      Out16 out(p.out, p.out16, p.out16_type, t * p.inter);
      for (int64_t i = 0; i < p.inter; ++i) {
        const float g = gate[i];
        out.Store(i, g / (1.0f + std::exp(-g)) * up[i]);
      }
    }
  }

  void WriteKv(const WriteKvParams& p) override {
    const KvCacheView& c = p.cache;
    const bool rope = p.rope.x != nullptr;
    if (rope) {
      CHECK_EQ(p.rope.head_dim, c.head_dim);
      Rope({.x = p.rope.x,
            .positions = p.rope.positions,
            .inv_freq = p.rope.inv_freq,
            .num_tokens = p.num_tokens,
            .num_heads = p.rope.num_heads,
            .head_dim = c.head_dim,
            .row_stride = p.rope.row_stride});
    }
    std::vector<float> k_row(c.head_dim), cos_v(c.head_dim / 2), sin_v(c.head_dim / 2);
    for (int64_t t = 0; t < p.num_tokens; ++t) {
      const int64_t slot = p.slot_mapping[t];
      if (slot < 0) continue;
      const int64_t block = slot / c.block_size, offset = slot % c.block_size;
      CHECK_LT(block, c.num_blocks);
      if (rope) RopeAngles(p.rope, t, cos_v, sin_v);
      for (int64_t h = 0; h < c.num_kv_heads; ++h) {
        const float* k = p.k + t * p.row_stride + h * c.head_dim;
        if (rope) {  // rotated on its way in, as Rope would have rotated it in place
          std::copy(k, k + c.head_dim, k_row.begin());
          Rotate(k_row.data(), cos_v, sin_v);
          k = k_row.data();
        }
        cpu::WriteRow(c.k_format, k, c.head_dim, c.block_size, cpu::KBlockHead(c, block, h),
                      offset);
        cpu::WriteRow(c.v_format, p.v + t * p.row_stride + h * c.head_dim, c.head_dim, c.block_size,
                      cpu::VBlockHead(c, block, h), offset);
      }
    }
  }

  void GatherTokens(const GatherTokensParams& p) override {
    for (int64_t i = 0; i < p.n; ++i) p.dst[p.rows[i]] = p.src[p.from[i]];
  }

  void PagedAttention(const PagedAttentionParams& p) override {
    const KvCacheView& c = p.cache;
    const int64_t d = c.head_dim;
    const int64_t group = p.num_heads / c.num_kv_heads;
    const bool k_direct = c.k_format.dtype == KvDType::kFp32;
    const bool v_direct = c.v_format.dtype == KvDType::kFp32;
    std::vector<float> scores, k_rows(c.block_size * d), v_rows(c.block_size * d), acc(d);
    for (int64_t s = 0; s < p.num_seqs; ++s) {
      const int32_t* table = p.block_tables + s * p.max_blocks_per_seq;
      const int64_t ctx = p.context_len[s];
      const int64_t qlen = p.query_len[s];
      scores.resize(ctx);
      for (int64_t j = 0; j < qlen; ++j) {
        const int64_t row = p.query_start[s] + j;
        const int64_t visible = ctx - qlen + j + 1;  // causal: positions [0, visible)
        const int64_t num_blocks = (visible + c.block_size - 1) / c.block_size;
        for (int64_t h = 0; h < p.num_heads; ++h) {
          const int64_t kvh = h / group;
          const float* q = p.q + row * p.q_stride + h * d;
          float max_score = -INFINITY;
          for (int64_t blk = 0; blk < num_blocks; ++blk) {
            const int64_t first = blk * c.block_size;
            const int64_t n = std::min(c.block_size, visible - first);
            cpu::BlockHead bh = cpu::KBlockHead(c, table[blk], kvh);
            const float* k = reinterpret_cast<const float*>(bh.data);
            if (!k_direct) {
              cpu::ReadRows(c.k_format, bh, d, n, k_rows.data());  // dequantized as read
              k = k_rows.data();
            }
            for (int64_t o = 0; o < n; ++o, k += d) {
              const float score = Dot(q, k, d) * p.scale;
              scores[first + o] = score;
              max_score = std::max(max_score, score);
            }
          }
          float sum = 0.0f;
          for (int64_t t = 0; t < visible; ++t) {
            scores[t] = std::exp(scores[t] - max_score);
            sum += scores[t];
          }
          const int64_t out_at = row * p.num_heads * d + h * d;
          float* out = p.out16 != nullptr ? acc.data() : p.out + out_at;
          std::fill(out, out + d, 0.0f);
          const float inv_sum = 1.0f / sum;
          for (int64_t blk = 0; blk < num_blocks; ++blk) {
            const int64_t first = blk * c.block_size;
            const int64_t n = std::min(c.block_size, visible - first);
            cpu::BlockHead bh = cpu::VBlockHead(c, table[blk], kvh);
            const float* v = reinterpret_cast<const float*>(bh.data);
            if (!v_direct) {
              cpu::ReadRows(c.v_format, bh, d, n, v_rows.data());
              v = v_rows.data();
            }
            for (int64_t o = 0; o < n; ++o, v += d) {
              const float w = scores[first + o] * inv_sum;
              for (int64_t i = 0; i < d; ++i) out[i] += w * v[i];
            }
          }
          if (p.out16 != nullptr) {
            Out16 rounded(nullptr, p.out16, p.out16_type, out_at);
            for (int64_t i = 0; i < d; ++i) rounded.Store(i, out[i]);
          }
        }
      }
    }
  }

  void CopyBlocks(const CopyBlocksParams& p) override {
    for (int64_t l = 0; l < p.num_layers; ++l) {
      const KvCacheView& src = p.src_layers[l];
      const KvCacheView& dst = p.dst_layers[l];
      const int64_t heads = src.num_kv_heads;
      const int64_t k_bytes = heads * cpu::DataBytes(src.k_format, src.block_size, src.head_dim);
      const int64_t v_bytes = heads * cpu::DataBytes(src.v_format, src.block_size, src.head_dim);
      const int64_t k_scales = heads * cpu::ScaleCount(src.k_format, src.block_size, src.head_dim);
      const int64_t v_scales = heads * cpu::ScaleCount(src.v_format, src.block_size, src.head_dim);
      for (int64_t i = 0; i < p.num_pairs; ++i) {
        const int64_t s = p.src[i], d = p.dst[i];
        std::memcpy(dst.k + d * k_bytes, src.k + s * k_bytes, k_bytes);
        std::memcpy(dst.v + d * v_bytes, src.v + s * v_bytes, v_bytes);
        if (k_scales > 0)
          std::memcpy(dst.k_scales + d * k_scales, src.k_scales + s * k_scales, 2 * k_scales);
        if (v_scales > 0)
          std::memcpy(dst.v_scales + d * v_scales, src.v_scales + s * v_scales, 2 * v_scales);
      }
    }
  }

  void AdjustLogits(const AdjustLogitsParams& p) override { cpu::AdjustLogits(p); }
  void Sample(const SampleParams& p) override { cpu::Sample(p); }
  void Logprobs(const LogprobsParams& p) override { cpu::Logprobs(p); }

 private:
  std::vector<float> widened_;    // 16-bit weights widened for one Gemm call
  std::vector<float> rounded_x_;  // its input rounded to the weights' type
};

}  // namespace

std::unique_ptr<Backend> CreateCpuBackend(const CpuBackendOptions& options) {
  return std::make_unique<CpuBackend>(options);
}

}  // namespace kvserve::kernels
