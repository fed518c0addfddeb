#include "kernels/cpu/kv_ops.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/kv_quant.h"

namespace kvserve::kernels::cpu {
namespace {

int64_t ParamStride(const KvFormat& f) { return f.scale_params(); }

// Quantizes x[0..n) with one parameter set into row codes starting at element `first`.
void EncodeSpan(const KvFormat& f, const float* x, int64_t n, uint8_t* row, int64_t first,
                uint16_t* params) {
  float lo = x[0], hi = x[0];
  for (int64_t i = 1; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  const QParams p = MakeParams(f.dtype, lo, hi);
  StoreParams(params, f.dtype, p);
  for (int64_t i = 0; i < n; ++i) SetCode(row, f.dtype, first + i, EncodeCode(f.dtype, x[i], p));
}

// Per-channel: the block's tokens share one parameter set per channel. The range grows with
// each token; when it does, the codes already written in that channel are re-encoded.
void WriteRowPerChannel(const KvFormat& f, const float* x, int64_t d, BlockHead bh, int64_t off) {
  const int64_t row_bytes = f.RowBytes(static_cast<int>(d));
  const int64_t ps = ParamStride(f);
  uint8_t* row = bh.data + off * row_bytes;
  for (int64_t c = 0; c < d; ++c) {
    uint16_t* params = bh.scales + c * ps;
    if (off == 0) {
      // The first token sets the range: exactly its value for int4 (asymmetric), ±|x| else.
      const QParams p = f.dtype == KvDType::kInt4
                            ? MakeParams(f.dtype, x[c], x[c])
                            : MakeParams(f.dtype, -std::fabs(x[c]), std::fabs(x[c]));
      StoreParams(params, f.dtype, p);
      SetCode(row, f.dtype, c, EncodeCode(f.dtype, x[c], p));
      continue;
    }
    QParams p = LoadParams(params, f.dtype);
    float lo, hi;
    if (f.dtype == KvDType::kInt4) {
      lo = p.zero;
      hi = p.zero + 15.0f * p.scale;
    } else {
      hi = p.scale * (f.dtype == KvDType::kInt8 ? 127.0f : 448.0f);
      lo = -hi;
    }
    if (x[c] < lo || x[c] > hi) {
      const QParams wider = MakeParams(f.dtype, std::min(lo, x[c]), std::max(hi, x[c]));
      for (int64_t t = 0; t < off; ++t) {
        uint8_t* old = bh.data + t * row_bytes;
        const float value = DecodeCode(f.dtype, GetCode(old, f.dtype, c), p);
        SetCode(old, f.dtype, c, EncodeCode(f.dtype, value, wider));
      }
      p = wider;
      StoreParams(params, f.dtype, p);
    }
    SetCode(row, f.dtype, c, EncodeCode(f.dtype, x[c], p));
  }
}

}  // namespace

int64_t DataBytes(const KvFormat& f, int64_t block_size, int64_t head_dim) {
  return f.RowBytes(static_cast<int>(head_dim)) * block_size;
}

int64_t ScaleCount(const KvFormat& f, int64_t block_size, int64_t head_dim) {
  return f.ScaleEntries(static_cast<int>(block_size), static_cast<int>(head_dim));
}

BlockHead KBlockHead(const KvCacheView& c, int64_t block, int64_t head) {
  const int64_t i = block * c.num_kv_heads + head;
  const int64_t sc = ScaleCount(c.k_format, c.block_size, c.head_dim);
  return {c.k + i * DataBytes(c.k_format, c.block_size, c.head_dim),
          c.k_scales == nullptr ? nullptr : c.k_scales + i * sc};
}

BlockHead VBlockHead(const KvCacheView& c, int64_t block, int64_t head) {
  const int64_t i = block * c.num_kv_heads + head;
  const int64_t sc = ScaleCount(c.v_format, c.block_size, c.head_dim);
  return {c.v + i * DataBytes(c.v_format, c.block_size, c.head_dim),
          c.v_scales == nullptr ? nullptr : c.v_scales + i * sc};
}

void WriteRow(const KvFormat& f, const float* x, int64_t d, int64_t block_size, BlockHead bh,
              int64_t off) {
  const int64_t row_bytes = f.RowBytes(static_cast<int>(d));
  uint8_t* row = bh.data + off * row_bytes;
  if (!f.quantized()) {
    if (f.dtype == KvDType::kFp32) {
      std::memcpy(row, x, sizeof(float) * d);
    } else {
      for (int64_t i = 0; i < d; ++i) StoreFloat(row, f.dtype, i, x[i]);
    }
    return;
  }
  const int64_t ps = ParamStride(f);
  switch (f.granularity) {
    case KvGranularity::kPerToken:
      EncodeSpan(f, x, d, row, 0, bh.scales + off * ps);
      break;
    case KvGranularity::kPerGroup: {
      const int64_t groups = d / f.group_size;
      for (int64_t g = 0; g < groups; ++g) {
        EncodeSpan(f, x + g * f.group_size, f.group_size, row, g * f.group_size,
                   bh.scales + (off * groups + g) * ps);
      }
      break;
    }
    case KvGranularity::kPerChannel:
      WriteRowPerChannel(f, x, d, bh, off);
      break;
    case KvGranularity::kNone:
      break;
  }
}

namespace {

// Decode tables: every fp16 and fp8 code's float value, so the attention inner loop does one
// load per element instead of bit manipulation.
const float* F16Table() {
  static const std::vector<float> table = [] {
    std::vector<float> t(65536);
    for (int i = 0; i < 65536; ++i) t[i] = F16ToFloat(static_cast<uint16_t>(i));
    return t;
  }();
  return table.data();
}

const float* F8Table() {
  static const std::vector<float> table = [] {
    std::vector<float> t(256);
    for (int i = 0; i < 256; ++i) t[i] = F8E4M3ToFloat(static_cast<uint8_t>(i));
    return t;
  }();
  return table.data();
}

// Decodes codes [c0, c1) of one row with one parameter set.
inline void DecodeSpan(KvDType t, const uint8_t* row, int64_t c0, int64_t c1, const QParams& p,
                       float* out) {
  switch (t) {
    case KvDType::kInt8:
      for (int64_t i = c0; i < c1; ++i)
        out[i] = static_cast<float>(static_cast<int8_t>(row[i])) * p.scale;
      break;
    case KvDType::kFp8E4M3: {
      const float* table = F8Table();
      for (int64_t i = c0; i < c1; ++i) out[i] = table[row[i]] * p.scale;
      break;
    }
    case KvDType::kInt4:
      for (int64_t i = c0; i < c1; ++i) {
        out[i] = static_cast<float>((row[i / 2] >> ((i & 1) * 4)) & 0xf) * p.scale + p.zero;
      }
      break;
    default:
      break;
  }
}

}  // namespace

void ReadRows(const KvFormat& f, BlockHead bh, int64_t d, int64_t n, float* out) {
  const int64_t row_bytes = f.RowBytes(static_cast<int>(d));
  if (!f.quantized()) {
    if (f.dtype == KvDType::kFp32) {
      std::memcpy(out, bh.data, sizeof(float) * d * n);
      return;
    }
    const auto* h = reinterpret_cast<const uint16_t*>(bh.data);
    if (f.dtype == KvDType::kFp16) {
      const float* table = F16Table();
      for (int64_t i = 0; i < d * n; ++i) out[i] = table[h[i]];
    } else {
      for (int64_t i = 0; i < d * n; ++i) out[i] = Bf16ToFloat(h[i]);
    }
    return;
  }
  const int64_t ps = ParamStride(f);
  if (f.granularity == KvGranularity::kPerChannel) {
    std::vector<QParams> params(d);
    for (int64_t c = 0; c < d; ++c) params[c] = LoadParams(bh.scales + c * ps, f.dtype);
    for (int64_t t = 0; t < n; ++t) {
      const uint8_t* row = bh.data + t * row_bytes;
      for (int64_t c = 0; c < d; ++c) DecodeSpan(f.dtype, row, c, c + 1, params[c], out + t * d);
    }
    return;
  }
  const int64_t group = f.granularity == KvGranularity::kPerGroup ? f.group_size : d;
  const int64_t groups = d / group;
  for (int64_t t = 0; t < n; ++t) {
    const uint8_t* row = bh.data + t * row_bytes;
    for (int64_t g = 0; g < groups; ++g) {
      const QParams p = LoadParams(bh.scales + (t * groups + g) * ps, f.dtype);
      DecodeSpan(f.dtype, row, g * group, (g + 1) * group, p, out + t * d);
    }
  }
}

}  // namespace kvserve::kernels::cpu
