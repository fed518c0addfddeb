// Float operations rounded once each, alike on the host and on a GPU: nvcc would otherwise
// contract a · b + c into one fused operation, and the CPU twins of the kernels must give the
// kernels' bits (sampling.h, logits_processing.h). Plain C++17 (also compiled by nvcc).
#ifndef KVSERVE_KERNELS_ROUNDED_H_
#define KVSERVE_KERNELS_ROUNDED_H_

#include "kernels/host_device.h"

namespace kvserve::kernels::rounded {

KVSERVE_HD inline float Add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

KVSERVE_HD inline float Sub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

KVSERVE_HD inline float Mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

KVSERVE_HD inline float Div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

}  // namespace kvserve::kernels::rounded

#endif  // KVSERVE_KERNELS_ROUNDED_H_
