// ThreadChecker: state that one thread owns, checked at run time and at compile time.
//
// "Owned by the core thread" is a contract the code states in prose; a ThreadChecker makes it
// checked. The checker records the owning thread (the first thread that checks it, or the next
// one after Detach) and every method that requires that thread checks it:
// - at run time, in builds with KVSERVE_THREAD_CHECKS (CMake turns it on wherever the tests are
//   built, and in Debug builds), a check on another thread crashes with both threads' ids, the
//   checker's name and the place;
// - at compile time, clang's thread-safety analysis (scripts/check-thread-safety.sh) treats the
//   checker as a capability: a member ABSL_GUARDED_BY(checker) may be touched only where the
//   checker was checked or by methods declared ABSL_EXCLUSIVE_LOCKS_REQUIRED(checker).
//
//   class Core {
//    public:
//     void Loop() { KVSERVE_CHECK_THREAD(core_thread_); Step(); }   // the owner's entry point
//    private:
//     void Step() ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_thread_) {
//       KVSERVE_CHECK_THREAD(core_thread_);
//       ++steps_;
//     }
//     ThreadChecker core_thread_{"core"};
//     int steps_ ABSL_GUARDED_BY(core_thread_) = 0;
//   };
//
// Thread-safe: Check and Detach may race (a Detach while the owner runs is a bug the next Check
// reports, never a data race). Constructors and destructors are outside both checks: hand the
// state over with Detach when it moves between threads (after a join, say).
#ifndef KVSERVE_COMMON_THREAD_CHECKER_H_
#define KVSERVE_COMMON_THREAD_CHECKER_H_

#include <atomic>
#include <thread>

#include "absl/base/thread_annotations.h"

#if defined(__clang__)
#define KVSERVE_THREAD_CAPABILITY __attribute__((capability("thread")))
#else
#define KVSERVE_THREAD_CAPABILITY
#endif

namespace kvserve {

class KVSERVE_THREAD_CAPABILITY ThreadChecker {
 public:
  // `name` (a string literal: it is kept) names the owner in failure messages, e.g. "core".
  explicit ThreadChecker(const char* name) : name_(name) {}
  ThreadChecker(const ThreadChecker&) = delete;
  ThreadChecker& operator=(const ThreadChecker&) = delete;

  // Binds the checker to the calling thread if it has no owner; crashes (LOG(FATAL)) if another
  // thread owns it. A no-op without KVSERVE_THREAD_CHECKS. Use KVSERVE_CHECK_THREAD.
  void Check(const char* file, int line) const ABSL_ASSERT_EXCLUSIVE_LOCK() {
#if KVSERVE_THREAD_CHECKS
    CheckSlow(file, line);
#endif
  }
  // Whether the calling thread may use the state now (it owns it, or nobody does). For tests.
  [[nodiscard]] bool CalledOnOwner() const;
  // Forgets the owner: the next Check binds whichever thread makes it.
  void Detach() { owner_.store(std::thread::id(), std::memory_order_relaxed); }

 private:
  void CheckSlow(const char* file, int line) const;

  const char* name_;
  mutable std::atomic<std::thread::id> owner_{};
};

}  // namespace kvserve

#define KVSERVE_CHECK_THREAD(checker) (checker).Check(__FILE__, __LINE__)

#endif  // KVSERVE_COMMON_THREAD_CHECKER_H_
