// How the tensor-core attention kernel (paged_attention_mma.cu) lays channels and tokens onto
// the fragments of mma.sync m16n8k16 (16-bit inputs, float32 accumulators) and movmatrix. A
// lane is (g, t) = (lane / 4, lane % 4). PTX fixes the fragments:
//   A (16 × 16): register r holds row g + 8·(r & 1), columns 2t + 8·(r >> 1) + {0, 1};
//   B (16 × 8):  register r holds rows (k) 2t + 8·r + {0, 1}, column (n) g;
//   C (16 × 8):  element e is row g + 8·(e >> 1), column 2t + (e & 1);
//   movmatrix.trans: lane (g, t) gives M[g][2t + {0, 1}] and gets M[2t + {0, 1}][g].
// The kernel's choices, below, are single-sourced here and checked against those layouts by
// tests/kernels/mma_layout_test.cc (an emulation: the products must come out exact).
#ifndef KVSERVE_KERNELS_CUDA_DEVICE_MMA_LAYOUT_H_
#define KVSERVE_KERNELS_CUDA_DEVICE_MMA_LAYOUT_H_

#include "kernels/host_device.h"

namespace kvserve::kernels::cuda::mma {

// Lane (g, t) loads, of a token row, 8 consecutive channels per 32-channel chunk j, as four
// 16-bit pairs: pair i holds channels LoadedChannel(t, j, i) + {0, 1}.
KVSERVE_HD constexpr int LoadedChannel(int t, int j, int i) { return 32 * j + 8 * t + 2 * i; }

// QK (k = channels): step (j, h) takes pairs 2h and 2h + 1 of chunk j as the K fragment's
// registers 0 and 1 (n = token g). The query's A fragment for that step must put the same
// channels at the same k: registers 0 / 1 (rows g, g + 8) hold channels QueryChannel + {0, 1},
// registers 2 / 3 hold QueryChannel + {2, 3}.
KVSERVE_HD constexpr int QueryChannel(int t, int j, int h) { return 32 * j + 8 * t + 4 * h; }

// PV (k = the step's 16 tokens): pair i of chunk j, loaded from tokens g (tile 0) and 8 + g
// (tile 1), transposed by movmatrix, is the V fragment of output n-tile (j, i); the scores'
// accumulators of tiles 0 and 1 are the probabilities' A fragment. Accumulator element e of
// that n-tile is output channel OutputChannel(t, j, i) + (e & 1) of row g + 8·(e >> 1).
KVSERVE_HD constexpr int OutputChannel(int t, int j, int i) { return 32 * j + 8 * t + 2 * i; }

}  // namespace kvserve::kernels::cuda::mma

#endif  // KVSERVE_KERNELS_CUDA_DEVICE_MMA_LAYOUT_H_
