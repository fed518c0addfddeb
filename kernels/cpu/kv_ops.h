// The CPU reference of the KV cache's formats: writing (quantizing) token rows into blocks,
// reading (dequantizing) them, and block copies. Used by the CPU backend; the CUDA kernels
// are checked against these.
#ifndef KVSERVE_KERNELS_CPU_KV_OPS_H_
#define KVSERVE_KERNELS_CPU_KV_OPS_H_

#include <cstdint>

#include "kernels/backend.h"

namespace kvserve::kernels::cpu {

// Pointers to one (block, head) of K or V.
struct BlockHead {
  uint8_t* data;     // block_size rows of RowBytes(head_dim)
  uint16_t* scales;  // ScaleEntries(block_size, head_dim) entries, or null
};

BlockHead KBlockHead(const KvCacheView& c, int64_t block, int64_t head);
BlockHead VBlockHead(const KvCacheView& c, int64_t block, int64_t head);

// Stores row `x` (head_dim floats) at offset `off` of the block-head in format `f`.
void WriteRow(const KvFormat& f, const float* x, int64_t head_dim, int64_t block_size, BlockHead bh,
              int64_t off);

// Decodes the rows [0, n) of a block-head into out[n][head_dim]. Unquantized fp32 rows are
// copied too, so callers see one shape.
void ReadRows(const KvFormat& f, BlockHead bh, int64_t head_dim, int64_t n, float* out);

// Bytes of one (block, head) of data and of scales.
int64_t DataBytes(const KvFormat& f, int64_t block_size, int64_t head_dim);
int64_t ScaleCount(const KvFormat& f, int64_t block_size, int64_t head_dim);

}  // namespace kvserve::kernels::cpu

#endif  // KVSERVE_KERNELS_CPU_KV_OPS_H_
