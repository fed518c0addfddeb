// The embedded Responses store (response_store.h): records in the process, each with its expiry,
// at most max_bytes of them (ids, tenants and records counted); past it, or past its expiry, the
// least recently stored goes first. Lost when the process ends; one per router replica.
#ifndef KVSERVE_FRONTEND_STORE_MEMORY_RESPONSE_STORE_H_
#define KVSERVE_FRONTEND_STORE_MEMORY_RESPONSE_STORE_H_

#include <cstdint>
#include <list>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "frontend/store/response_store.h"

namespace kvserve::frontend {

class MemoryResponseStore final : public ResponseStore {
 public:
  MemoryResponseStore(absl::Duration ttl, int64_t max_bytes) : ttl_(ttl), max_bytes_(max_bytes) {}

  absl::Status Put(const std::string& tenant, const std::string& id,
                   const std::string& record) override ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<std::optional<std::string>> Get(const std::string& tenant,
                                                 const std::string& id) override
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<bool> Delete(const std::string& tenant, const std::string& id) override
      ABSL_LOCKS_EXCLUDED(mu_);

  // Tests: records held now and their bytes.
  [[nodiscard]] size_t size() const ABSL_LOCKS_EXCLUDED(mu_);
  [[nodiscard]] int64_t bytes() const ABSL_LOCKS_EXCLUDED(mu_);
  // Tests: the clock that expiry reads.
  void set_clock(absl::Time (*now)()) { now_ = now; }

 private:
  struct Entry {
    std::string key, record;
    absl::Time expires;
  };
  using Order = std::list<Entry>;  // oldest first

  static std::string Key(const std::string& tenant, const std::string& id);
  void Erase(Order::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops what expired and, past the bound, the oldest.
  void Trim(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const absl::Duration ttl_;
  const int64_t max_bytes_;
  absl::Time (*now_)() = absl::Now;
  mutable absl::Mutex mu_;
  Order order_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Order::iterator> by_key_ ABSL_GUARDED_BY(mu_);
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kvserve::frontend

#endif  // KVSERVE_FRONTEND_STORE_MEMORY_RESPONSE_STORE_H_
