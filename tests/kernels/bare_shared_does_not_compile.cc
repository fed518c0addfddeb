// Must not compile: device code declares shared memory with KVSERVE_SHARED
// (kernels/cuda/device/shared_memory.cuh), and the emulator refuses a bare __shared__, whose static
// would keep the previous block's values. tests/CMakeLists.txt compiles this file and checks
// the compiler's message.
#include "tests/testing/cuda_emulator/emulator.h"

float Kernel() {
  __shared__ float x[32];
  return x[threadIdx.x % 32];
}
