// What the kernel charges for the two things a router request is made of besides its own work
// (docs/ROUTING.md, "The floor of the router's shape"): entering a system call (getpid, through
// syscall(2) so that nothing caches it), and waking another thread (an eventfd ping-pong: one
// write and the peer's read per direction), with both threads on one core and on two. And what a
// large table's memory costs to touch first ("Tables on huge pages"): 256 MiB of fresh anonymous
// memory written one byte per 4 KiB page, on small pages and advised for huge pages
// (MADV_HUGEPAGE, as common/huge_pages.h maps the prefix index's tables).
// Not built by CMake (nothing runs it in CI):
//
//   g++ -O2 -std=c++20 -pthread tests/bench/kernel_costs.cc -o /tmp/kernel_costs
//   /tmp/kernel_costs
#include <pthread.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <thread>

namespace {

using Clock = std::chrono::steady_clock;

double MicrosSince(Clock::time_point start, int n) {
  return std::chrono::duration<double, std::micro>(Clock::now() - start).count() / n;
}

void Pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

double SyscallMicros() {
  constexpr int kCalls = 1'000'000;
  const Clock::time_point start = Clock::now();
  for (int i = 0; i < kCalls; ++i) syscall(SYS_getpid);
  return MicrosSince(start, kCalls);
}

// One-way wake-up: half a round trip of two threads handing a token back and forth.
double WakeupMicros(int cpu_a, int cpu_b) {
  constexpr int kRounds = 20'000;
  const int to_peer = eventfd(0, 0), to_main = eventfd(0, 0);
  std::thread peer([&] {
    Pin(cpu_b);
    uint64_t v = 0;
    for (int i = 0; i < kRounds; ++i) {
      if (read(to_peer, &v, sizeof(v)) != sizeof(v)) return;
      v = 1;
      if (write(to_main, &v, sizeof(v)) != sizeof(v)) return;
    }
  });
  Pin(cpu_a);
  const Clock::time_point start = Clock::now();
  uint64_t v = 1;
  for (int i = 0; i < kRounds; ++i) {
    v = 1;
    if (write(to_peer, &v, sizeof(v)) != sizeof(v)) break;
    if (read(to_main, &v, sizeof(v)) != sizeof(v)) break;
  }
  const double micros = MicrosSince(start, 2 * kRounds);
  peer.join();
  close(to_peer);
  close(to_main);
  return micros;
}

// Per 4 KiB of a fresh mapping, the first write's cost (the page fault, zeroing included).
double FirstTouchMicrosPer4K(bool huge) {
  constexpr size_t kBytes = size_t{256} << 20, kHuge = size_t{2} << 20;
  void* raw =
      mmap(nullptr, kBytes + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return -1;
  char* p = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(raw) + kHuge - 1) & ~(kHuge - 1));
  if (huge) madvise(p, kBytes, MADV_HUGEPAGE);
  const Clock::time_point start = Clock::now();
  for (size_t i = 0; i < kBytes; i += 4096) p[i] = 1;
  const double micros = MicrosSince(start, static_cast<int>(kBytes / 4096));
  munmap(raw, kBytes + kHuge);
  return micros;
}

}  // namespace

int main() {
  std::printf("system call (getpid): %.2f us\n", SyscallMicros());
  std::printf("thread wake-up, one core: %.2f us\n", WakeupMicros(0, 0));
  if (std::thread::hardware_concurrency() > 1) {
    std::printf("thread wake-up, two cores: %.2f us\n", WakeupMicros(0, 1));
  }
  std::printf("first touch per 4 KiB, small pages: %.2f us\n", FirstTouchMicrosPer4K(false));
  std::printf("first touch per 4 KiB, huge pages advised: %.2f us\n", FirstTouchMicrosPer4K(true));
  return 0;
}
