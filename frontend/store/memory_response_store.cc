// The embedded Responses store (memory_response_store.h).
#include "frontend/store/memory_response_store.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace kvserve::frontend {

std::string MemoryResponseStore::Key(const std::string& tenant, const std::string& id) {
  return absl::StrCat(tenant, ":", id);
}

void MemoryResponseStore::Erase(Order::iterator it) {
  bytes_ -= static_cast<int64_t>(it->key.size() + it->record.size());
  by_key_.erase(it->key);
  order_.erase(it);
}

void MemoryResponseStore::Trim(absl::Time now) {
  // Every record lives the same TTL, so the oldest stored expires first.
  while (!order_.empty() && (order_.front().expires <= now || bytes_ > max_bytes_)) {
    Erase(order_.begin());
  }
}

absl::Status MemoryResponseStore::Put(const std::string& tenant, const std::string& id,
                                      const std::string& record) {
  std::string key = Key(tenant, id);
  const int64_t size = static_cast<int64_t>(key.size() + record.size());
  if (size > max_bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the response is ", size, " bytes, more than the whole store holds (", max_bytes_, ")"));
  }
  const absl::Time now = now_();
  absl::MutexLock lock(&mu_);
  if (auto it = by_key_.find(key); it != by_key_.end()) Erase(it->second);
  order_.push_back({key, record, now + ttl_});
  by_key_[std::move(key)] = std::prev(order_.end());
  bytes_ += size;
  Trim(now);
  return absl::OkStatus();
}

absl::StatusOr<std::optional<std::string>> MemoryResponseStore::Get(const std::string& tenant,
                                                                    const std::string& id) {
  absl::MutexLock lock(&mu_);
  Trim(now_());
  auto it = by_key_.find(Key(tenant, id));
  if (it == by_key_.end()) return std::optional<std::string>();
  return std::optional<std::string>(it->second->record);
}

absl::StatusOr<bool> MemoryResponseStore::Delete(const std::string& tenant, const std::string& id) {
  absl::MutexLock lock(&mu_);
  Trim(now_());
  auto it = by_key_.find(Key(tenant, id));
  if (it == by_key_.end()) return false;
  Erase(it->second);
  return true;
}

size_t MemoryResponseStore::size() const {
  absl::MutexLock lock(&mu_);
  return order_.size();
}

int64_t MemoryResponseStore::bytes() const {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

}  // namespace kvserve::frontend
