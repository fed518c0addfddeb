// The CUDA runtime and cuBLAS calls of the CUDA backend, on the CPU, for the emulated build
// (KVSERVE_CUDA=EMULATED): kernels_cuda compiled by the host compiler runs its kernels on the
// emulator (emulator.h) and links these definitions instead of libcudart and libcublas.
//
// The emulated machine has kDevices devices of KVSERVE_EMULATED_GPU_MIB MiB each (default
// 4096), 132 SMs and compute capability 9.0. Device and pinned memory are host memory. Work runs
// when it is enqueued, so every stream is always idle and every event complete: one valid
// order of a correctly synchronised program (missing synchronisation goes unseen here).
#include <cblas.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <vector>

namespace {

constexpr int kDevices = 8;

struct Allocation {
  int device;
  size_t bytes;
};

class Devices {
 public:
  static Devices& Get() {
    static Devices devices;
    return devices;
  }

  cudaError_t Allocate(void** p, size_t bytes, int device) {
    std::lock_guard<std::mutex> lock(mu_);
    if (used_[device] + bytes > capacity_) return cudaErrorMemoryAllocation;
    *p = ::operator new (std::max<size_t>(bytes, 1), std::align_val_t{256}, std::nothrow);
    if (*p == nullptr) return cudaErrorMemoryAllocation;
    used_[device] += bytes;
    live_[*p] = {device, bytes};
    return cudaSuccess;
  }

  cudaError_t Free(void* p) {
    if (p == nullptr) return cudaSuccess;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(p);
    if (it == live_.end()) return cudaErrorInvalidValue;
    used_[it->second.device] -= it->second.bytes;
    live_.erase(it);
    ::operator delete (p, std::align_val_t{256});
    return cudaSuccess;
  }

  void Info(int device, size_t* free, size_t* total) {
    std::lock_guard<std::mutex> lock(mu_);
    *total = capacity_;
    *free = capacity_ - used_[device];
  }

 private:
  Devices() {
    const char* mib = std::getenv("KVSERVE_EMULATED_GPU_MIB");
    capacity_ = size_t{1048576} * (mib != nullptr ? std::strtoull(mib, nullptr, 10) : 4096);
  }

  std::mutex mu_;
  size_t capacity_;
  size_t used_[kDevices] = {};
  std::map<void*, Allocation> live_;
};

thread_local int current_device = 0;
thread_local cudaError_t last_error = cudaSuccess;

cudaError_t Fail(cudaError_t e) {
  last_error = e;
  return e;
}

// Streams and events only need distinct non-null handles.
template <typename Handle>
Handle NewHandle() {
  return reinterpret_cast<Handle>(new char);
}
template <typename Handle>
void DeleteHandle(Handle h) {
  delete reinterpret_cast<char*>(h);
}

}  // namespace

extern "C" {

cudaError_t cudaGetDeviceCount(int* count) {
  *count = kDevices;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= kDevices) return Fail(cudaErrorInvalidDevice);
  current_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  *device = current_device;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (device < 0 || device >= kDevices) return Fail(cudaErrorInvalidDevice);
  switch (attr) {
    case cudaDevAttrMultiProcessorCount:
      *value = 132;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor:
      *value = 9;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor:
      *value = 0;
      return cudaSuccess;
    default:
      return Fail(cudaErrorInvalidValue);
  }
}

cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }

cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  Devices::Get().Info(current_device, free, total);
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** p, size_t bytes) {
  const cudaError_t e = Devices::Get().Allocate(p, bytes, current_device);
  return e == cudaSuccess ? e : Fail(e);
}

cudaError_t cudaMallocAsync(void** p, size_t bytes, cudaStream_t) { return cudaMalloc(p, bytes); }

cudaError_t cudaFree(void* p) {
  const cudaError_t e = Devices::Get().Free(p);
  return e == cudaSuccess ? e : Fail(e);
}

cudaError_t cudaFreeAsync(void* p, cudaStream_t) { return cudaFree(p); }

cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned int) {
  *p = ::operator new (std::max<size_t>(bytes, 1), std::align_val_t{256}, std::nothrow);
  return *p != nullptr ? cudaSuccess : Fail(cudaErrorMemoryAllocation);
}

cudaError_t cudaMallocHost(void** p, size_t bytes) { return cudaHostAlloc(p, bytes, 0); }

cudaError_t cudaFreeHost(void* p) {
  ::operator delete (p, std::align_val_t{256});
  return cudaSuccess;
}

cudaError_t cudaHostGetDevicePointer(void** device, void* host, unsigned int) {
  *device = host;  // mapped pinned memory: the same address on both sides
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {
  if (bytes > 0) std::memmove(dst, src, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t) {
  return cudaMemcpy(dst, src, bytes, kind);
}

cudaError_t cudaMemset(void* p, int value, size_t bytes) {
  std::memset(p, value, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t) {
  return cudaMemset(p, value, bytes);
}

cudaError_t cudaStreamCreate(cudaStream_t* s) {
  *s = NewHandle<cudaStream_t>();
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int) { return cudaStreamCreate(s); }

cudaError_t cudaStreamDestroy(cudaStream_t s) {
  DeleteHandle(s);
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamQuery(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned int) { return cudaSuccess; }

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int) {
  *e = NewHandle<cudaEvent_t>();
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, 0); }

cudaError_t cudaEventDestroy(cudaEvent_t e) {
  DeleteHandle(e);
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) { return cudaSuccess; }
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventQuery(cudaEvent_t) { return cudaSuccess; }

cudaError_t cudaGetLastError() {
  const cudaError_t e = last_error;
  last_error = cudaSuccess;
  return e;
}

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "no error";
    case cudaErrorMemoryAllocation:
      return "out of memory (emulated device)";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal (emulated device)";
    case cudaErrorInvalidValue:
      return "invalid argument (emulated device)";
    default:
      return "unknown error (emulated device)";
  }
}

// cuBLAS: the column-major GEMMs the backend calls, as OpenBLAS sgemm on float copies of
// 16-bit operands (exact), accumulating in float like CUBLAS_COMPUTE_32F.

struct cublasContext {};

cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
  *handle = new cublasContext;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t, cudaStream_t) { return CUBLAS_STATUS_SUCCESS; }

const char* cublasGetStatusString(cublasStatus_t status) {
  return status == CUBLAS_STATUS_SUCCESS ? "CUBLAS_STATUS_SUCCESS"
                                         : "not supported by the emulated cuBLAS";
}

}  // extern "C"

namespace {

CBLAS_TRANSPOSE Op(cublasOperation_t op) { return op == CUBLAS_OP_N ? CblasNoTrans : CblasTrans; }

// An m×n operand stored column-major with leading dimension ld, as floats.
bool ToFloat(const void* x, cudaDataType type, int ld, int rows, int cols,
             std::vector<float>* out) {
  const size_t n = cols == 0 ? 0 : static_cast<size_t>(ld) * (cols - 1) + rows;
  out->resize(n);
  for (size_t i = 0; i < n; ++i) {
    switch (type) {
      case CUDA_R_32F:
        (*out)[i] = static_cast<const float*>(x)[i];
        break;
      case CUDA_R_16F:
        (*out)[i] = __half2float(static_cast<const __half*>(x)[i]);
        break;
      case CUDA_R_16BF:
        (*out)[i] = __bfloat162float(static_cast<const __nv_bfloat16*>(x)[i]);
        break;
      default:
        return false;
    }
  }
  return true;
}

}  // namespace

extern "C" {

cublasStatus_t cublasSgemm_v2(cublasHandle_t, cublasOperation_t transa, cublasOperation_t transb,
                              int m, int n, int k, const float* alpha, const float* A, int lda,
                              const float* B, int ldb, const float* beta, float* C, int ldc) {
  cblas_sgemm(CblasColMajor, Op(transa), Op(transb), m, n, k, *alpha, A, lda, B, ldb, *beta, C,
              ldc);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t, cublasOperation_t transa, cublasOperation_t transb,
                            int m, int n, int k, const void* alpha, const void* A,
                            cudaDataType Atype, int lda, const void* B, cudaDataType Btype, int ldb,
                            const void* beta, void* C, cudaDataType Ctype, int ldc,
                            cublasComputeType_t compute, cublasGemmAlgo_t) {
  if (Ctype != CUDA_R_32F || compute != CUBLAS_COMPUTE_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  std::vector<float> a, b;
  const bool an = transa == CUBLAS_OP_N, bn = transb == CUBLAS_OP_N;
  if (!ToFloat(A, Atype, lda, an ? m : k, an ? k : m, &a) ||
      !ToFloat(B, Btype, ldb, bn ? k : n, bn ? n : k, &b)) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  cblas_sgemm(CblasColMajor, Op(transa), Op(transb), m, n, k, *static_cast<const float*>(alpha),
              a.data(), lda, b.data(), ldb, *static_cast<const float*>(beta),
              static_cast<float*>(C), ldc);
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"
