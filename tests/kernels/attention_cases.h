// The paged-attention test cases that the CUDA conformance test (tests/gpu/cuda_backend_test.cc)
// and the CPU emulation of the tensor-core kernel (attention_emulation_test.cc) share:
// every KV format, batch shapes, a host KV pool, random inputs and the tolerance check.
#ifndef KVSERVE_TESTS_KERNELS_ATTENTION_CASES_H_
#define KVSERVE_TESTS_KERNELS_ATTENTION_CASES_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "common/kv/kv_format.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"

namespace kvserve::kernels {

// Normal(0, stddev) values.
inline std::vector<float> Random(size_t n, std::mt19937& rng, float stddev = 1.0f) {
  std::normal_distribution<float> d(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// Max over elements of |a − b| / (atol + rtol·|b|); <= 1 passes.
inline double WorstRatio(const std::vector<float>& a, const std::vector<float>& b, double atol,
                         double rtol) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0.0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    worst = std::max(worst, std::fabs(a[i] - b[i]) / (atol + rtol * std::fabs(b[i])));
  }
  return worst;
}

// The tensor-core attention kernel against the float32 CPU reference: it rounds queries,
// probabilities and dequantized K / V to 16 bits (bf16 for a bf16 cache: 8 significant bits;
// fp16 otherwise: 11), so outputs made of values up to ~4.5 (normal inputs) are off by up to
// about half a unit in the last place of such values: the CPU emulation measured 1.8e-3 (fp16)
// and 5.8e-3 (bf16) at most. A wrong index, mask or scale is off by the outputs' own size.
struct Tolerance {
  double atol, rtol;
};
inline Tolerance TensorCoreTolerance(KvDType cache) {
  return cache == KvDType::kBf16 ? Tolerance{1.2e-2, 2e-2} : Tolerance{4e-3, 5e-3};
}

// A KV cache pool (one layer) in host memory.
struct Pool {
  Pool(const KvFormat& kf, const KvFormat& vf, int64_t blocks, int64_t heads, int64_t bs, int64_t d)
      : k(blocks * heads * bs * kf.RowBytes(d)),
        v(blocks * heads * bs * vf.RowBytes(d)),
        ks(std::max<int64_t>(1, blocks * heads * kf.ScaleEntries(bs, d))),
        vs(std::max<int64_t>(1, blocks * heads * vf.ScaleEntries(bs, d))) {
    view.k_format = kf;
    view.v_format = vf;
    view.num_blocks = blocks;
    view.num_kv_heads = heads;
    view.block_size = bs;
    view.head_dim = d;
  }
  KvCacheView Host() {
    KvCacheView c = view;
    c.k = k.data();
    c.v = v.data();
    c.k_scales = view.k_format.quantized() ? ks.data() : nullptr;
    c.v_scales = view.v_format.quantized() ? vs.data() : nullptr;
    return c;
  }
  std::vector<uint8_t> k, v;
  std::vector<uint16_t> ks, vs;
  KvCacheView view;
};

// A KV format pair under test, named for the test output.
struct FormatCase {
  std::string name;
  KvFormat k, v;
};

// Every dtype and granularity, mixed K / V granularities included.
inline std::vector<FormatCase> Formats() {
  auto f = [](KvDType t, KvGranularity g = KvGranularity::kNone, int group = 0) {
    return KvFormat{t, g, group};
  };
  using G = KvGranularity;
  return {
      {"fp32", f(KvDType::kFp32), f(KvDType::kFp32)},
      {"fp16", f(KvDType::kFp16), f(KvDType::kFp16)},
      {"bf16", f(KvDType::kBf16), f(KvDType::kBf16)},
      {"fp8/per_token", f(KvDType::kFp8E4M3, G::kPerToken), f(KvDType::kFp8E4M3, G::kPerToken)},
      {"fp8/per_channel", f(KvDType::kFp8E4M3, G::kPerChannel),
       f(KvDType::kFp8E4M3, G::kPerChannel)},
      {"int8/per_token", f(KvDType::kInt8, G::kPerToken), f(KvDType::kInt8, G::kPerToken)},
      {"int8/per_group:32", f(KvDType::kInt8, G::kPerGroup, 32),
       f(KvDType::kInt8, G::kPerGroup, 32)},
      {"int8/k:per_channel,v:per_token", f(KvDType::kInt8, G::kPerChannel),
       f(KvDType::kInt8, G::kPerToken)},
      {"int4/per_token", f(KvDType::kInt4, G::kPerToken), f(KvDType::kInt4, G::kPerToken)},
      {"int4/per_group:16", f(KvDType::kInt4, G::kPerGroup, 16),
       f(KvDType::kInt4, G::kPerGroup, 16)},
      {"int4/per_channel", f(KvDType::kInt4, G::kPerChannel), f(KvDType::kInt4, G::kPerChannel)},
  };
}

// A batch: per sequence its cached prefix length and its new (query) tokens.
struct SeqSpec {
  int prefix, query;
};

// Attention geometry: query heads, KV heads, head_dim, block size, and the batch.
struct Shape {
  int heads, kv_heads, d, bs;
  std::vector<SeqSpec> seqs;
};

inline std::string Describe(const FormatCase& fc, const Shape& s) {
  return fc.name + " heads " + std::to_string(s.heads) + "/" + std::to_string(s.kv_heads) + " d " +
         std::to_string(s.d) + " bs " + std::to_string(s.bs);
}

// A batch's sizes and block tables over a shuffled pool of a few spare blocks more than it
// needs, so that no sequence reads consecutive blocks.
struct BatchLayout {
  int64_t num_seqs = 0, max_blocks = 0, pool_blocks = 0;
  int64_t max_query = 0, max_context = 0, query_tokens = 0;
  std::vector<int32_t> tables;  // [num_seqs][max_blocks]

  // The pool slot of context token t of sequence i.
  int64_t Slot(const Shape& s, int64_t i, int64_t t) const {
    return int64_t{tables[i * max_blocks + t / s.bs]} * s.bs + t % s.bs;
  }
};

inline BatchLayout LayOut(const Shape& s, std::mt19937& rng) {
  BatchLayout b;
  b.num_seqs = static_cast<int64_t>(s.seqs.size());
  int64_t total_blocks = 0;
  for (const SeqSpec& q : s.seqs) {
    const int64_t blocks = (q.prefix + q.query + s.bs - 1) / s.bs;
    b.max_blocks = std::max(b.max_blocks, blocks);
    total_blocks += blocks;
    b.max_query = std::max<int64_t>(b.max_query, q.query);
    b.max_context = std::max<int64_t>(b.max_context, q.prefix + q.query);
    b.query_tokens += q.query;
  }
  b.pool_blocks = total_blocks + 3;
  std::vector<int32_t> order(b.pool_blocks);
  for (int64_t i = 0; i < b.pool_blocks; ++i) order[i] = static_cast<int32_t>(i);
  std::shuffle(order.begin(), order.end(), rng);
  b.tables.assign(b.num_seqs * b.max_blocks, 0);
  int64_t next = 0;
  for (int64_t i = 0; i < b.num_seqs; ++i) {
    const int64_t blocks = (s.seqs[i].prefix + s.seqs[i].query + s.bs - 1) / s.bs;
    for (int64_t k = 0; k < blocks; ++k) b.tables[i * b.max_blocks + k] = order[next++];
  }
  return b;
}

}  // namespace kvserve::kernels

#endif  // KVSERVE_TESTS_KERNELS_ATTENTION_CASES_H_
