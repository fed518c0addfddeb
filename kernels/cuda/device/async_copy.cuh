// Asynchronous global → shared copies (cp.async, sm_80+) and shared-memory matrix loads
// (ldmatrix), for kernels that pipeline their loads through shared memory
// (paged_attention_pipelined.cuh). Under the CPU emulation (tests/testing/cuda_emulator) the
// copies are queued per thread and land when that thread waits for their group, so a read
// before the wait or before the barrier after it sees the block's poisoned shared memory.
//
//   CopyAsync16(smem, gmem, valid);  // 16 bytes, zeros when !valid (gmem is then not read)
//   CommitCopies();                  // closes a group of this thread's copies
//   WaitCopies<1>();                 // all but the newest group have landed (this thread's)
//   __syncthreads();                 // ... and are visible to the block
#ifndef KVSERVE_KERNELS_CUDA_DEVICE_ASYNC_COPY_CUH_
#define KVSERVE_KERNELS_CUDA_DEVICE_ASYNC_COPY_CUH_

#include <cstdint>

namespace kvserve::kernels::cuda {

#if !defined(KVSERVE_CUDA_EMULATION)
__device__ __forceinline__ uint32_t SharedAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
#endif

// Copies BYTES (4, 8 or 16) from global `src` to shared `dst` (both aligned to BYTES), or
// writes BYTES zeros when `valid` is false (src-size 0: nothing is read).
template <int BYTES>
__device__ __forceinline__ void CopyAsync(void* dst, const void* src, bool valid) {
  static_assert(BYTES == 4 || BYTES == 8 || BYTES == 16);
#if defined(KVSERVE_CUDA_EMULATION)
  ::kvserve::emulation::CopyAsync(dst, src, BYTES, valid ? BYTES : 0);
#else
  const int src_bytes = valid ? BYTES : 0;
  if constexpr (BYTES == 16) {  // .cg: L2 only, the data is read once per block
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SharedAddress(dst)),
                 "l"(src), "r"(src_bytes));
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(SharedAddress(dst)),
                 "l"(src), "n"(BYTES), "r"(src_bytes));
  }
#endif
}

// Closes the group of this thread's copies issued since the last commit (possibly empty).
__device__ __forceinline__ void CommitCopies() {
#if defined(KVSERVE_CUDA_EMULATION)
  ::kvserve::emulation::CommitCopies();
#else
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}

// Waits until at most N of this thread's committed groups are still in flight (the newest N).
template <int N>
__device__ __forceinline__ void WaitCopies() {
#if defined(KVSERVE_CUDA_EMULATION)
  ::kvserve::emulation::WaitCopies(N);
#else
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

// ldmatrix.x4: lane l gives the shared address of row l % 8 of 8×8 16-bit matrix l / 8 (16
// bytes, 16-byte aligned); lane (g, t) = (l / 4, l % 4) gets in r[i] matrix i's row g, columns
// 2t and 2t + 1 — or, TRANS, row g of its transpose (rows 2t and 2t + 1 of column g).
template <bool TRANS>
__device__ __forceinline__ void LoadMatrices(const void* row, uint32_t (&r)[4]) {
#if defined(KVSERVE_CUDA_EMULATION)
  ::kvserve::emulation::LoadMatrices(row, TRANS, r);
#else
  if constexpr (TRANS) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(SharedAddress(row)));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(SharedAddress(row)));
  }
#endif
}

}  // namespace kvserve::kernels::cuda

#endif  // KVSERVE_KERNELS_CUDA_DEVICE_ASYNC_COPY_CUH_
