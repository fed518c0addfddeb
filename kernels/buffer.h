// A typed array in a backend's memory (device memory for a device backend), owned: freed
// through the backend that allocated it. Move-only.
//
//   Buffer<float> w(backend, n);  backend->Upload(w.data(), host.data(), w.bytes());
#ifndef KVSERVE_KERNELS_BUFFER_H_
#define KVSERVE_KERNELS_BUFFER_H_

#include <cstddef>
#include <utility>
#include <vector>

#include "kernels/backend.h"

namespace kvserve::kernels {

template <typename T>
class Buffer {
 public:
  Buffer() = default;
  // Zero-filled; `host` allocates the backend's host memory (the swap pool) instead.
  Buffer(Backend* backend, size_t size, bool host = false)
      : backend_(backend), size_(size), host_(host) {
    if (size_ == 0) return;
    void* p = host ? backend->AllocateHost(bytes()) : backend->Allocate(bytes());
    data_ = static_cast<T*>(p);
  }
  // A copy of `values` in backend memory.
  static Buffer FromHost(Backend* backend, const std::vector<T>& values) {
    Buffer b(backend, values.size());
    backend->Upload(b.data(), values.data(), b.bytes());
    return b;
  }
  ~Buffer() { Reset(); }
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      Reset();
      std::swap(backend_, o.backend_);
      std::swap(data_, o.data_);
      std::swap(size_, o.size_);
      std::swap(host_, o.host_);
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  [[nodiscard]] T* data() const { return data_; }
  [[nodiscard]] size_t size() const { return size_; }
  [[nodiscard]] size_t bytes() const { return size_ * sizeof(T); }
  [[nodiscard]] bool empty() const { return size_ == 0; }

 private:
  void Reset() {
    if (data_ != nullptr) host_ ? backend_->FreeHost(data_) : backend_->Free(data_);
    data_ = nullptr;
    size_ = 0;
  }

  Backend* backend_ = nullptr;
  T* data_ = nullptr;
  size_t size_ = 0;
  bool host_ = false;
};

}  // namespace kvserve::kernels

#endif  // KVSERVE_KERNELS_BUFFER_H_
