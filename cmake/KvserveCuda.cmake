# Decides whether the CUDA backend is built (KVSERVE_CUDA = AUTO | ON | OFF | EMULATED) and sets
# the architectures. AUTO turns CUDA on when nvcc is found (on PATH or in /usr/local/cuda/bin).
# CMAKE_CUDA_ARCHITECTURES defaults to the release set; CI passes 90 alone to save time.
#
# EMULATED is for tests on machines without a GPU: the same CUDA backend, its kernels compiled
# by the host compiler and run on the CPU (tests/testing/cuda_emulator), with the CUDA runtime,
# cuBLAS and NCCL calls answered there too. It needs the toolkit's headers only.
# KVSERVE_CUDART is what code that calls the CUDA runtime itself links: libcudart, or in
# EMULATED the headers (the emulated runtime comes with kvserve::kernels_cuda).

# Debian 12's CMake 3.25 FindCUDAToolkit marks CUDA::nvToolsExt deprecated whenever the project
# asks for CMake >= 3.25, without checking that the target exists; CUDA 12.9+ ships no
# nvToolsExt library, so a stock CMake stops there. Find the toolkit as a 3.24 project would.
macro(kvserve_find_cuda_toolkit)
  set(_kvserve_min_version "${CMAKE_MINIMUM_REQUIRED_VERSION}")
  set(CMAKE_MINIMUM_REQUIRED_VERSION 3.24)
  find_package(CUDAToolkit REQUIRED)
  set(CMAKE_MINIMUM_REQUIRED_VERSION "${_kvserve_min_version}")
endmacro()

string(TOUPPER "${KVSERVE_CUDA}" _kvserve_cuda)
if(NOT _kvserve_cuda MATCHES "^(AUTO|ON|OFF|EMULATED)$")
  message(FATAL_ERROR "KVSERVE_CUDA must be AUTO, ON, OFF or EMULATED, got '${KVSERVE_CUDA}'")
endif()

set(KVSERVE_HAVE_CUDA OFF)
set(KVSERVE_CUDA_EMULATED OFF)
if(_kvserve_cuda STREQUAL "EMULATED")
  if(NOT DEFINED CUDAToolkit_ROOT AND EXISTS /usr/local/cuda/include/cuda_runtime_api.h)
    set(CUDAToolkit_ROOT /usr/local/cuda)
  endif()
  kvserve_find_cuda_toolkit()
  set(KVSERVE_HAVE_CUDA ON)
  set(KVSERVE_CUDA_EMULATED ON)
  set(KVSERVE_CUDART CUDA::toolkit)
elseif(NOT _kvserve_cuda STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
    find_program(_kvserve_nvcc nvcc)
    if(NOT _kvserve_nvcc)
      set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
    endif()
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES OR CMAKE_CUDA_ARCHITECTURES STREQUAL "")
      set(CMAKE_CUDA_ARCHITECTURES "80;86;89;90" CACHE STRING "CUDA architectures" FORCE)
    endif()
    enable_language(CUDA)
    set(CMAKE_CUDA_STANDARD 17)  # CMake 3.25 (Debian 12) knows no CUDA20 flags for nvcc
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    kvserve_find_cuda_toolkit()
    find_library(KVSERVE_NCCL_LIBRARY nccl
                 HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/lib/x86_64-linux-gnu)
    set(KVSERVE_HAVE_CUDA ON)
    set(KVSERVE_CUDART CUDA::cudart)
  elseif(_kvserve_cuda STREQUAL "ON")
    message(FATAL_ERROR "KVSERVE_CUDA=ON but no CUDA compiler (nvcc) was found")
  endif()
endif()
if(KVSERVE_CUDA_EMULATED)
  message(STATUS "kvserve: CUDA backend EMULATED (kernels run on the CPU, for tests)")
else()
  message(STATUS "kvserve: CUDA backend ${KVSERVE_HAVE_CUDA} (architectures: ${CMAKE_CUDA_ARCHITECTURES})")
endif()
# Where device code runs on the CPU (the emulated build, the emulation tests): a GPU faults on
# an access its type's alignment does not hold (a uint4 load off 16 bytes, a __half2 off 4),
# and the host types have the same alignments, so UBSan's alignment check aborts there too.
set(KVSERVE_DEVICE_ALIGNMENT_CHECK -fsanitize=alignment -fno-sanitize-recover=alignment)
