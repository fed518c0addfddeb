#include "common/huge_pages.h"

#include <cctype>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <new>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "gtest/gtest.h"

namespace kvserve {
namespace {

// The VmFlags line of the mapping that starts at `p` in /proc/self/smaps ("" if none does).
std::string VmFlagsAt(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool in_mapping = false;
  while (std::getline(smaps, line)) {
    // A mapping's first line starts with its range ("7f..-7f.. rw-p ..."), lowercase hex; the
    // lines of its fields with a capitalised name ("VmFlags: rd wr ...").
    const size_t dash = line.find('-');
    if (!line.empty() && std::isxdigit(line[0]) && !std::isupper(line[0]) &&
        dash < line.find(' ')) {
      in_mapping = std::stoull(line.substr(0, dash), nullptr, 16) == reinterpret_cast<uintptr_t>(p);
    } else if (in_mapping && line.rfind("VmFlags:", 0) == 0) {
      return line;
    }
  }
  return "";
}

TEST(HugePagesTest, ALargeAllocationIsAlignedAdvisedAndCounted) {
  const size_t before = HugeMappedBytes();
  constexpr size_t kBytes = 5 * kHugePageBytes + 12345;
  char* p = static_cast<char*>(MapHuge(kBytes));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % kHugePageBytes, 0u);
  EXPECT_GE(HugeMappedBytes() - before, kBytes);
  EXPECT_LT(HugeMappedBytes() - before, kBytes + 4096 * 16);
  std::memset(p, 0x5a, kBytes);  // every byte is writable
  EXPECT_EQ(p[kBytes - 1], 0x5a);
  if (std::filesystem::exists("/sys/kernel/mm/transparent_hugepage")) {
    // The whole huge pages are advised ("hg"); the partial last one is a mapping of its own.
    EXPECT_NE(VmFlagsAt(p).find(" hg"), std::string::npos) << VmFlagsAt(p);
    EXPECT_EQ(VmFlagsAt(p + 5 * kHugePageBytes).find(" hg"), std::string::npos);
  }
  UnmapHuge(p, kBytes);
  EXPECT_EQ(HugeMappedBytes(), before);
}

TEST(HugePagesTest, SmallAllocationsComeFromTheHeap) {
  const size_t before = HugeMappedBytes();
  HugePageAllocator<uint64_t> alloc;
  uint64_t* p = alloc.allocate(1000);
  p[999] = 7;
  EXPECT_EQ(HugeMappedBytes(), before);
  alloc.deallocate(p, 1000);
  // A count whose bytes overflow is refused, not wrapped into a small allocation.
  EXPECT_THROW((void)alloc.allocate(std::numeric_limits<size_t>::max() / 4),
               std::bad_array_new_length);
}

TEST(HugePagesTest, AHashMapOnItGrowsCopiesAndReleasesEverything) {
  using Map = absl::flat_hash_map<uint64_t, uint64_t, absl::Hash<uint64_t>, std::equal_to<uint64_t>,
                                  HugePageAllocator<std::pair<const uint64_t, uint64_t>>>;
  const size_t before = HugeMappedBytes();
  {
    Map map;
    for (uint64_t i = 0; i < 300'000; ++i) map[i * 2654435761u] = i;  // grows past 2 MiB
    EXPECT_GT(HugeMappedBytes(), before);
    for (uint64_t i = 0; i < 300'000; i += 2) map.erase(i * 2654435761u);
    Map copy = map;
    Map moved = std::move(map);
    ASSERT_EQ(copy.size(), 150'000u);
    for (uint64_t i = 1; i < 300'000; i += 2) {
      ASSERT_EQ(copy.at(i * 2654435761u), i);
      ASSERT_EQ(moved.at(i * 2654435761u), i);
    }
    EXPECT_FALSE(copy.contains(0));
  }
  EXPECT_EQ(HugeMappedBytes(), before);
}

}  // namespace
}  // namespace kvserve
