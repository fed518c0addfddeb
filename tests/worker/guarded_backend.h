// A CPU backend whose "device" memory the host cannot touch, for tests: Allocate hands out
// pages of one arena that stay PROT_NONE except while one of this backend's ops runs (the CPU
// backend inside does the work). Engine code that reads or writes device memory directly,
// instead of through Upload / Download and the ops, faults here as it would on a GPU, where
// such a pointer is not host memory at all. Host memory (AllocateHost: the swap pool) stays
// accessible, as pinned memory is.
#ifndef KVSERVE_TESTS_WORKER_GUARDED_BACKEND_H_
#define KVSERVE_TESTS_WORKER_GUARDED_BACKEND_H_

#include <sys/mman.h>

#include <cstring>
#include <memory>

#include "glog/logging.h"
#include "kernels/backend.h"

namespace kvserve::worker::testing {

class GuardedCpuBackend final : public kernels::Backend {
 public:
  static constexpr size_t kArenaBytes = size_t{8} << 30;  // address space, reserved lazily
  static constexpr size_t kPage = 4096;

  GuardedCpuBackend() : inner_(kernels::CreateCpuBackend({.num_threads = 1})) {
    arena_ = static_cast<char*>(
        mmap(nullptr, kArenaBytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
    CHECK(arena_ != MAP_FAILED) << "guarded backend: no address space";
  }
  ~GuardedCpuBackend() override { munmap(arena_, kArenaBytes); }

  std::string_view name() const override { return "guarded-cpu"; }

  void* Allocate(size_t bytes) override {
    char* p = arena_ + used_;
    used_ += (std::max<size_t>(bytes, 1) + kPage - 1) / kPage * kPage;
    CHECK_LE(used_, kArenaBytes) << "guarded backend: arena full";
    Open open(this);
    std::memset(p, 0, bytes);  // as the CPU and CUDA backends do
    return p;
  }
  void Free(void* /*p*/) override {}  // the arena goes as a whole
  // Bytes handed out by Allocate so far (never returned: Free keeps them).
  [[nodiscard]] size_t allocated() const { return used_; }
  void* AllocateHost(size_t bytes) override { return inner_->AllocateHost(bytes); }
  void FreeHost(void* p) override { inner_->FreeHost(p); }
  void Upload(void* dst, const void* src, size_t bytes) override {
    Open open(this);
    inner_->Upload(dst, src, bytes);
  }
  void Download(void* dst, const void* src, size_t bytes) override {
    Open open(this);
    inner_->Download(dst, src, bytes);
  }
  void Copy(void* dst, const void* src, size_t bytes) override {
    Open open(this);
    inner_->Copy(dst, src, bytes);
  }
  void Synchronize() override { inner_->Synchronize(); }
  void Gemm(const kernels::GemmParams& p) override {
    Run([&] { inner_->Gemm(p); });
  }
  void Embedding(const kernels::EmbeddingParams& p) override {
    Run([&] { inner_->Embedding(p); });
  }
  void RmsNorm(const kernels::RmsNormParams& p) override {
    Run([&] { inner_->RmsNorm(p); });
  }
  void Rope(const kernels::RopeParams& p) override {
    Run([&] { inner_->Rope(p); });
  }
  void SiluMul(const kernels::SiluMulParams& p) override {
    Run([&] { inner_->SiluMul(p); });
  }
  void WriteKv(const kernels::WriteKvParams& p) override {
    Run([&] { inner_->WriteKv(p); });
  }
  void PagedAttention(const kernels::PagedAttentionParams& p) override {
    Run([&] { inner_->PagedAttention(p); });
  }
  void CopyBlocks(const kernels::CopyBlocksParams& p) override {
    Run([&] { inner_->CopyBlocks(p); });
  }
  void AdjustLogits(const kernels::AdjustLogitsParams& p) override {
    Run([&] { inner_->AdjustLogits(p); });
  }
  void Sample(const kernels::SampleParams& p) override {
    Run([&] { inner_->Sample(p); });
  }
  void Logprobs(const kernels::LogprobsParams& p) override {
    Run([&] { inner_->Logprobs(p); });
  }

 private:
  // The arena is readable and writable while one lives.
  class Open {
   public:
    explicit Open(GuardedCpuBackend* b) : b_(b) { b_->Protect(PROT_READ | PROT_WRITE); }
    ~Open() { b_->Protect(PROT_NONE); }
    Open(const Open&) = delete;
    Open& operator=(const Open&) = delete;

   private:
    GuardedCpuBackend* b_;
  };

  template <typename F>
  void Run(const F& op) {
    Open open(this);
    op();
  }
  void Protect(int prot) {
    if (used_ > 0) CHECK_EQ(mprotect(arena_, used_, prot), 0) << "guarded backend: mprotect";
  }

  std::unique_ptr<kernels::Backend> inner_;
  char* arena_ = nullptr;
  size_t used_ = 0;
};

}  // namespace kvserve::worker::testing

#endif  // KVSERVE_TESTS_WORKER_GUARDED_BACKEND_H_
