#include "common/thread_checker.h"

#include <sstream>

#include "glog/logging.h"

namespace kvserve {

bool ThreadChecker::CalledOnOwner() const {
  const std::thread::id owner = owner_.load(std::memory_order_relaxed);
  return owner == std::thread::id() || owner == std::this_thread::get_id();
}

void ThreadChecker::CheckSlow(const char* file, int line) const {
  const std::thread::id self = std::this_thread::get_id();
  std::thread::id owner = owner_.load(std::memory_order_relaxed);
  if (owner == self) return;
  if (owner == std::thread::id() &&
      owner_.compare_exchange_strong(owner, self, std::memory_order_relaxed)) {
    return;  // bound now
  }
  std::ostringstream ids;
  ids << "thread " << self << ", owned by thread " << owner;
  LOG(FATAL) << file << ":" << line << ": state owned by the " << name_
             << " thread used on another thread (" << ids.str() << ")";
}

}  // namespace kvserve
