#include "common/huge_pages.h"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>

namespace kvserve {
namespace {

std::atomic<size_t> mapped_bytes{0};

size_t RoundUp(size_t bytes, size_t to) { return (bytes + to - 1) & ~(to - 1); }

size_t PageBytes() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

}  // namespace

void* MapHuge(size_t bytes) {
  const size_t size = RoundUp(bytes, PageBytes());
  // Mapped one huge page larger, then trimmed to a range that starts 2 MiB-aligned: the kernel
  // backs only aligned 2 MiB ranges with huge pages.
  void* raw = mmap(nullptr, size + kHugePageBytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) throw std::bad_alloc();
  const auto start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = RoundUp(start, kHugePageBytes);
  if (aligned > start) munmap(raw, aligned - start);
  if (const size_t tail = start + kHugePageBytes - aligned; tail > 0) {
    munmap(reinterpret_cast<void*>(aligned + size), tail);
  }
  void* p = reinterpret_cast<void*>(aligned);
  // Only whole huge pages are advised: a huge page reaching past the allocation's end would be
  // backed whole once touched (rounding the prefix index's tables up so cost 28% more memory per
  // entry; docs/ROUTING.md). Advice only: where huge pages are off, small pages serve all of it.
  madvise(p, size & ~(kHugePageBytes - 1), MADV_HUGEPAGE);
  mapped_bytes.fetch_add(size, std::memory_order_relaxed);
  return p;
}

void UnmapHuge(void* p, size_t bytes) {
  const size_t size = RoundUp(bytes, PageBytes());
  munmap(p, size);
  mapped_bytes.fetch_sub(size, std::memory_order_relaxed);
}

size_t HugeMappedBytes() { return mapped_bytes.load(std::memory_order_relaxed); }

}  // namespace kvserve
