// Where the Responses API keeps what `store` asks it to (POST /v1/responses with store true, the
// default as OpenAI's): each stored response's record by tenant and id, read again by a chained
// request (previous_response_id), GET, DELETE and input_items. Records are opaque text (the
// handlers' JSON, frontend/http/responses_handlers.h) and expire after the store's TTL.
//
// Two stores: an embedded one, in the process, bounded in bytes (MemoryResponseStore), and a
// shared one that several router replicas read alike: Redis or Valkey (RedisResponseStore).
//
//   ASSIGN_OR_RETURN(std::unique_ptr<ResponseStore> store, MakeResponseStore(options));
//   RETURN_IF_ERROR(store->Put(tenant, id, record));
//   ASSIGN_OR_RETURN(std::optional<std::string> record, store->Get(tenant, id));
//
// Thread-safe: the handlers call it from any of their threads.
#ifndef KVSERVE_FRONTEND_STORE_RESPONSE_STORE_H_
#define KVSERVE_FRONTEND_STORE_RESPONSE_STORE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace kvserve::frontend {

class ResponseStore {
 public:
  virtual ~ResponseStore() = default;
  // Stores (or replaces) `record` under (tenant, id) for the store's TTL.
  virtual absl::Status Put(const std::string& tenant, const std::string& id,
                           const std::string& record) = 0;
  // The record, or nullopt when there is none for this tenant (never stored, expired, evicted,
  // deleted, or another tenant's). Unavailable when a shared store cannot be reached.
  virtual absl::StatusOr<std::optional<std::string>> Get(const std::string& tenant,
                                                         const std::string& id) = 0;
  // Whether there was one to delete.
  virtual absl::StatusOr<bool> Delete(const std::string& tenant, const std::string& id) = 0;
};

struct ResponseStoreOptions {
  // "memory" (the embedded store), "redis://HOST:PORT[/DB]" (Redis or Valkey), or "none": no
  // store (store true and previous_response_id are refused by name).
  std::string url = "memory";
  absl::Duration ttl = absl::Hours(24);
  int64_t max_bytes = int64_t{256} << 20;        // the embedded store's bound; the oldest go first
  std::string key_prefix = "kvserve:response:";  // Redis keys: prefix, tenant, ':', id
  absl::Duration timeout = absl::Seconds(2);     // a Redis command's
};

// The store `options.url` names (nullptr for "none"); InvalidArgument naming the flag's value
// for one that is not understood.
absl::StatusOr<std::unique_ptr<ResponseStore>> MakeResponseStore(
    const ResponseStoreOptions& options);

// The tenant of a request: a digest of the API key it was let in with (empty when the front
// takes no keys), so that no store holds the keys themselves.
std::string TenantOf(std::string_view api_key);

}  // namespace kvserve::frontend

#endif  // KVSERVE_FRONTEND_STORE_RESPONSE_STORE_H_
