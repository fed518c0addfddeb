// cuBLAS for the emulated build (runtime.cc): the column-major GEMMs the backend calls, queued
// on the handle's stream, as OpenBLAS sgemm on float copies of 16-bit operands (exact),
// accumulating in float like CUBLAS_COMPUTE_32F. alpha and beta are read at the call, as
// cuBLAS reads host-pointer scalars.
#include <cblas.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <vector>

#include "tests/testing/cuda_emulator/streams.h"

struct cublasContext {
  cudaStream_t stream = nullptr;
};

namespace {

CBLAS_TRANSPOSE Op(cublasOperation_t op) { return op == CUBLAS_OP_N ? CblasNoTrans : CblasTrans; }

bool Supported(cudaDataType type) {
  return type == CUDA_R_32F || type == CUDA_R_16F || type == CUDA_R_16BF;
}

// A rows×cols operand stored column-major with leading dimension ld, as floats.
std::vector<float> ToFloat(const void* x, cudaDataType type, int ld, int rows, int cols) {
  const size_t n = cols == 0 ? 0 : static_cast<size_t>(ld) * (cols - 1) + rows;
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    switch (type) {
      case CUDA_R_16F:
        out[i] = __half2float(static_cast<const __half*>(x)[i]);
        break;
      case CUDA_R_16BF:
        out[i] = __bfloat162float(static_cast<const __nv_bfloat16*>(x)[i]);
        break;
      default:
        out[i] = static_cast<const float*>(x)[i];
        break;
    }
  }
  return out;
}

}  // namespace

extern "C" {

cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
  *handle = new cublasContext;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}

// The backend gives cuBLAS a fixed workspace (so that recording a graph allocates nothing); the
// emulated GEMMs need none.
cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t, void*, size_t) {
  return CUBLAS_STATUS_SUCCESS;
}

const char* cublasGetStatusString(cublasStatus_t status) {
  return status == CUBLAS_STATUS_SUCCESS ? "CUBLAS_STATUS_SUCCESS"
                                         : "not supported by the emulated cuBLAS";
}

cublasStatus_t cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t transa,
                              cublasOperation_t transb, int m, int n, int k, const float* alpha,
                              const float* A, int lda, const float* B, int ldb, const float* beta,
                              float* C, int ldc) {
  kvserve::emulation::CountLaunch();
  kvserve::emulation::Enqueue(handle->stream, [=, alpha = *alpha, beta = *beta] {
    cblas_sgemm(CblasColMajor, Op(transa), Op(transb), m, n, k, alpha, A, lda, B, ldb, beta, C,
                ldc);
  });
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void* alpha,
                            const void* A, cudaDataType Atype, int lda, const void* B,
                            cudaDataType Btype, int ldb, const void* beta, void* C,
                            cudaDataType Ctype, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t) {
  if (Ctype != CUDA_R_32F || compute != CUBLAS_COMPUTE_32F || !Supported(Atype) ||
      !Supported(Btype)) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  const float a = *static_cast<const float*>(alpha), b = *static_cast<const float*>(beta);
  kvserve::emulation::CountLaunch();
  kvserve::emulation::Enqueue(handle->stream, [=] {
    const bool an = transa == CUBLAS_OP_N, bn = transb == CUBLAS_OP_N;
    const std::vector<float> fa = ToFloat(A, Atype, lda, an ? m : k, an ? k : m);
    const std::vector<float> fb = ToFloat(B, Btype, ldb, bn ? k : n, bn ? n : k);
    cblas_sgemm(CblasColMajor, Op(transa), Op(transb), m, n, k, a, fa.data(), lda, fb.data(), ldb,
                b, static_cast<float*>(C), ldc);
  });
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"
