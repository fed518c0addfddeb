#include "kernels/cuda/device/cuda_check.h"
#include "kernels/cuda/device/launch.cuh"
#include "kernels/cuda/device/shared_memory.cuh"
#include "kernels/cuda/ops/kv_codec.cuh"
#include "kernels/cuda/ops/kv_write.h"

namespace kvserve::kernels::cuda {
namespace {

constexpr int kMaxHeadDim = 512;

struct Side {
  const float* x;
  uint8_t* cache;
  uint16_t* scales;
  DevKvLayout layout;
  const float* inv_freq;  // K with RoPE fused: rotated as read (null: as stored)
};

// One rotate_half pair's rotation: the same operations, unfused, as RopeKernel's.
__device__ inline void RotatePair(float x1, float x2, float s, float c, float* y1, float* y2) {
  *y1 = __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s));
  *y2 = __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s));
}

// Channel `c` of the row at `x` (head_dim values), rotated for position `pos` when the side
// has RoPE fused.
__device__ inline float Load(const Side& s, const float* x, int64_t c, int64_t head_dim,
                             int32_t pos) {
  if (s.inv_freq == nullptr) return x[c];
  const int64_t half = head_dim / 2, i = c % half;
  float sn, cs;
  sincosf(static_cast<float>(pos) * s.inv_freq[i], &sn, &cs);
  float y1, y2;
  RotatePair(x[i], x[i + half], sn, cs, &y1, &y2);
  return c < half ? y1 : y2;
}

// Token t's query heads of KV head `head` rotated in place (grid blocks with z = 0).
__device__ void RotateQueries(const KvWriteArgs& a, int64_t t, int64_t head) {
  const int64_t group = a.q_heads / a.num_kv_heads, half = a.head_dim / 2;
  const float pos = static_cast<float>(a.positions[t]);
  for (int64_t k = threadIdx.x; k < group * half; k += blockDim.x) {
    const int64_t h = head * group + k / half, i = k % half;
    float sn, cs;
    sincosf(pos * a.inv_freq[i], &sn, &cs);
    float* row = a.q + t * a.q_stride + h * a.head_dim;
    RotatePair(row[i], row[i + half], sn, cs, &row[i], &row[i + half]);
  }
}

__device__ inline void StoreUnquantized(uint8_t* row, KvDType t, int64_t i, float x) {
  switch (t) {
    case KvDType::kFp32:
      reinterpret_cast<float*>(row)[i] = x;
      break;
    case KvDType::kFp16:
      reinterpret_cast<uint16_t*>(row)[i] = __half_as_ushort(__float2half_rn(x));
      break;
    case KvDType::kBf16:
      reinterpret_cast<uint16_t*>(row)[i] = __bfloat16_as_ushort(__float2bfloat16_rn(x));
      break;
    default:
      break;
  }
}

// Per-token / per-group / unquantized: one thread block per (token, head, K|V), one thread per
// channel. Codes go through shared memory so that int4 nibble pairs are written whole.
__device__ void WriteRowSpans(const Side& s, const float* x, int32_t pos, int64_t block,
                              int64_t off, int64_t head, int64_t num_kv_heads, int64_t block_size,
                              int64_t head_dim) {
  KVSERVE_SHARED(float[kMaxHeadDim], values);
  KVSERVE_SHARED(uint8_t[kMaxHeadDim], codes);
  const DevKvLayout& l = s.layout;
  const int64_t bh = block * num_kv_heads + head;
  uint8_t* row = s.cache + (bh * block_size + off) * l.row_bytes;
  const int c = threadIdx.x;
  if (l.granularity == KvGranularity::kNone) {
    if (c < head_dim) StoreUnquantized(row, l.dtype, c, Load(s, x, c, head_dim, pos));
    return;
  }
  if (c < head_dim) values[c] = Load(s, x, c, head_dim, pos);
  __syncthreads();
  const int64_t group = l.granularity == KvGranularity::kPerGroup ? l.group_size : head_dim;
  const int64_t groups = head_dim / group;
  // One thread per group finds its range and parameters (a fixed order: exact min / max).
  KVSERVE_SHARED(DevQParams[kMaxHeadDim], params);
  if (c < groups) {
    float lo = values[c * group], hi = lo;
    for (int64_t i = 1; i < group; ++i) {
      lo = fminf(lo, values[c * group + i]);
      hi = fmaxf(hi, values[c * group + i]);
    }
    params[c] = DevMakeParams(l.dtype, lo, hi);
    DevStoreParams(s.scales + bh * l.scale_entries + (off * groups + c) * l.params, l.dtype,
                   params[c]);
  }
  __syncthreads();
  if (c < head_dim) codes[c] = DevEncode(l.dtype, values[c], params[c / group]);
  __syncthreads();
  if (c < l.row_bytes) {
    row[c] = l.dtype == KvDType::kInt4
                 ? static_cast<uint8_t>(codes[2 * c] | (codes[2 * c + 1] << 4))
                 : codes[c];
  }
}

__device__ inline uint8_t GetCode(const uint8_t* row, KvDType t, int64_t i) {
  if (t == KvDType::kInt4) return (row[i / 2] >> ((i & 1) * 4)) & 0xf;
  return row[i];
}

__device__ inline void SetCode(uint8_t* row, KvDType t, int64_t i, uint8_t code) {
  if (t == KvDType::kInt4) {
    const int shift = (i & 1) * 4;
    row[i / 2] = static_cast<uint8_t>((row[i / 2] & ~(0xf << shift)) | ((code & 0xf) << shift));
  } else {
    row[i] = code;
  }
}

// Per-channel: the run of tokens [t0, t1) landing in one block, in order. Thread j owns
// channels 2j and 2j + 1 (one int4 byte), so read-modify-writes of nibbles never race.
__device__ void WriteRunPerChannel(const Side& s, int64_t row_stride, const int64_t* slots,
                                   const int32_t* positions, int64_t t0, int64_t t1, int64_t head,
                                   int64_t num_kv_heads, int64_t block_size, int64_t head_dim) {
  const DevKvLayout& l = s.layout;
  const int64_t block = slots[t0] / block_size;
  const int64_t bh = block * num_kv_heads + head;
  uint8_t* data = s.cache + bh * block_size * l.row_bytes;
  uint16_t* scales = s.scales + bh * l.scale_entries;
  for (int64_t c = 2 * threadIdx.x; c < 2 * threadIdx.x + 2 && c < head_dim; ++c) {
    uint16_t* pc = scales + c * l.params;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t off = slots[t] % block_size;
      const float x = Load(s, s.x + t * row_stride + head * head_dim, c, head_dim,
                           s.inv_freq != nullptr ? positions[t] : 0);
      uint8_t* row = data + off * l.row_bytes;
      if (off == 0) {
        const DevQParams p = l.dtype == KvDType::kInt4
                                 ? DevMakeParams(l.dtype, x, x)
                                 : DevMakeParams(l.dtype, -fabsf(x), fabsf(x));
        DevStoreParams(pc, l.dtype, p);
        SetCode(row, l.dtype, c, DevEncode(l.dtype, x, p));
        continue;
      }
      DevQParams p = DevLoadParams(pc, l.dtype);
      float lo, hi;
      if (l.dtype == KvDType::kInt4) {
        lo = p.zero;
        hi = __fadd_rn(p.zero, __fmul_rn(15.0f, p.scale));
      } else {
        hi = __fmul_rn(p.scale, l.dtype == KvDType::kInt8 ? 127.0f : 448.0f);
        lo = -hi;
      }
      if (x < lo || x > hi) {
        const DevQParams wider = DevMakeParams(l.dtype, fminf(lo, x), fmaxf(hi, x));
        for (int64_t o = 0; o < off; ++o) {
          uint8_t* old = data + o * l.row_bytes;
          const float value = DevDecode(l.dtype, GetCode(old, l.dtype, c), p);
          SetCode(old, l.dtype, c, DevEncode(l.dtype, value, wider));
        }
        p = wider;
        DevStoreParams(pc, l.dtype, p);
      }
      SetCode(row, l.dtype, c, DevEncode(l.dtype, x, p));
    }
  }
}

// grid (num_tokens, num_kv_heads, 2): blockIdx.z picks K (0) or V (1).
__global__ void KvWriteKernel(KvWriteArgs a) {
  const int64_t t = blockIdx.x, head = blockIdx.y;
  const bool is_v = blockIdx.z == 1;
  const bool rope = a.q != nullptr;
  const Side s = is_v ? Side{a.v, a.v_cache, a.v_scales, a.v_layout, nullptr}
                      : Side{a.k, a.k_cache, a.k_scales, a.k_layout, rope ? a.inv_freq : nullptr};
  if (rope && !is_v) RotateQueries(a, t, head);  // every token, written or not
  const int64_t slot = a.slot_mapping[t];
  if (slot < 0) return;
  const int64_t block = slot / a.block_size;
  if (s.layout.granularity != KvGranularity::kPerChannel) {
    WriteRowSpans(s, s.x + t * a.row_stride + head * a.head_dim, rope ? a.positions[t] : 0, block,
                  slot % a.block_size, head, a.num_kv_heads, a.block_size, a.head_dim);
    return;
  }
  // Only the first token of a run in one block works; it walks the run.
  if (t > 0 && a.slot_mapping[t - 1] >= 0 && a.slot_mapping[t - 1] / a.block_size == block) return;
  int64_t end = t + 1;
  while (end < a.num_tokens && a.slot_mapping[end] >= 0 &&
         a.slot_mapping[end] / a.block_size == block) {
    ++end;
  }
  WriteRunPerChannel(s, a.row_stride, a.slot_mapping, a.positions, t, end, head, a.num_kv_heads,
                     a.block_size, a.head_dim);
}

}  // namespace

void LaunchKvWrite(const KvWriteArgs& args, cudaStream_t stream) {
  if (args.num_tokens == 0) return;
  CHECK_LE(args.head_dim, kMaxHeadDim) << "KV write: head_dim above " << kMaxHeadDim;
  CHECK(args.q == nullptr || args.q_heads % args.num_kv_heads == 0)
      << "KV write with RoPE: " << args.q_heads << " query heads over " << args.num_kv_heads
      << " KV heads";
  const dim3 grid(static_cast<unsigned>(args.num_tokens), static_cast<unsigned>(args.num_kv_heads),
                  2);
  const int threads = static_cast<int>((args.head_dim + 31) / 32 * 32);
  LaunchKernel(KvWriteKernel, grid, threads, 0, stream, args);
}

}  // namespace kvserve::kernels::cuda
