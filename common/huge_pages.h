// An allocator for large tables that are touched at random: an allocation of 2 MiB or more is
// mapped on its own, aligned to 2 MiB and marked for transparent huge pages (madvise
// MADV_HUGEPAGE), so that the kernel backs its whole 2 MiB ranges with huge pages where it can:
// one page fault per 2 MiB instead of 512 when a table is first filled (a 4 KiB first touch
// costs ~14 us on this project's VM, tests/bench/kernel_costs.cc), and fewer TLB misses. A
// partial last 2 MiB stays on small pages, so the memory used is what the allocation uses.
// Smaller allocations come from operator new. Where huge pages are off
// (/sys/kernel/mm/transparent_hugepage/enabled "never") all of it is small pages.
//
//   absl::flat_hash_map<K, V, absl::Hash<K>, std::equal_to<K>,
//                       HugePageAllocator<std::pair<const K, V>>> table;
//
// Stateless: any thread. An allocation that cannot be mapped throws std::bad_alloc.
#ifndef KVSERVE_COMMON_HUGE_PAGES_H_
#define KVSERVE_COMMON_HUGE_PAGES_H_

#include <cstddef>
#include <limits>
#include <new>

namespace kvserve {

inline constexpr size_t kHugePageBytes = size_t{2} << 20;

// `bytes` (at least kHugePageBytes) mapped, 2 MiB-aligned and marked for huge pages; release
// with UnmapHuge(p, bytes). Throws std::bad_alloc.
void* MapHuge(size_t bytes);
void UnmapHuge(void* p, size_t bytes);
// Bytes mapped by MapHuge and not yet unmapped, over every thread (heap statistics such as
// mallinfo2 do not see them).
size_t HugeMappedBytes();

template <class T>
class HugePageAllocator {
 public:
  using value_type = T;

  HugePageAllocator() = default;
  template <class U>
  explicit HugePageAllocator(const HugePageAllocator<U>& /*other*/) {}

  T* allocate(size_t n) {
    if (n > std::numeric_limits<size_t>::max() / sizeof(T)) throw std::bad_array_new_length();
    const size_t bytes = n * sizeof(T);
    if (bytes < kHugePageBytes) {
      return static_cast<T*>(::operator new (bytes, std::align_val_t{alignof(T)}));
    }
    return static_cast<T*>(MapHuge(bytes));
  }

  void deallocate(T* p, size_t n) {
    const size_t bytes = n * sizeof(T);
    if (bytes < kHugePageBytes) {
      ::operator delete (p, std::align_val_t{alignof(T)});
      return;
    }
    UnmapHuge(p, bytes);
  }

  template <class U>
  bool operator==(const HugePageAllocator<U>& /*other*/) const {
    return true;
  }
};

}  // namespace kvserve

#endif  // KVSERVE_COMMON_HUGE_PAGES_H_
