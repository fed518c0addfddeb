// Which Responses store a flag names, and a request's tenant (response_store.h).
#include "frontend/store/response_store.h"

#include <xxhash.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "frontend/store/memory_response_store.h"
#include "frontend/store/redis_response_store.h"

namespace kvserve::frontend {

absl::StatusOr<std::unique_ptr<ResponseStore>> MakeResponseStore(
    const ResponseStoreOptions& options) {
  if (options.url == "none") return nullptr;
  if (options.ttl <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--responses-store-ttl-seconds must be > 0");
  }
  if (options.url == "memory") {
    if (options.max_bytes <= 0) {
      return absl::InvalidArgumentError("--responses-store-max-mb must be > 0");
    }
    return std::make_unique<MemoryResponseStore>(options.ttl, options.max_bytes);
  }
  if (options.url.starts_with("redis://")) {
    ASSIGN_OR_RETURN(auto store, RedisResponseStore::Create(options.url, options));
    return store;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--responses-store '", options.url.substr(0, 200),
                   "' is not one of memory, none, redis://HOST:PORT[/DB]"));
}

std::string TenantOf(std::string_view api_key) {
  if (api_key.empty()) return "";
  const XXH128_hash_t h = XXH3_128bits(api_key.data(), api_key.size());
  return absl::StrFormat("%016x%016x", h.high64, h.low64);
}

}  // namespace kvserve::frontend
