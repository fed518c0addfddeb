// KVSERVE_HD marks functions that host code and CUDA kernels share (__host__ __device__ under
// nvcc, nothing otherwise).
#ifndef KVSERVE_KERNELS_HOST_DEVICE_H_
#define KVSERVE_KERNELS_HOST_DEVICE_H_

#if defined(__CUDACC__)
#define KVSERVE_HD __host__ __device__
#else
#define KVSERVE_HD
#endif

#endif  // KVSERVE_KERNELS_HOST_DEVICE_H_
