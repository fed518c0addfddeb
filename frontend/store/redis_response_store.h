// The shared Responses store (response_store.h) in Redis or Valkey: one key per record
// (prefix, tenant, ':', id) set with the TTL as its expiry (SET ... PX), so every router replica
// pointed at the same server reads what any of them stored, and the server's own memory policy
// bounds it. One connection, made at the first command and again after one fails (a connect
// that failed is not tried again for a second: meanwhile commands fail at once, so that a store
// that is down does not hold every handler thread for its timeout); a command that cannot be
// answered within the timeout is Unavailable. Commands take turns on the connection.
//
//   ASSIGN_OR_RETURN(auto store, RedisResponseStore::Create("redis://127.0.0.1:6379/0", options));
#ifndef KVSERVE_FRONTEND_STORE_REDIS_RESPONSE_STORE_H_
#define KVSERVE_FRONTEND_STORE_REDIS_RESPONSE_STORE_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "frontend/store/response_store.h"

struct redisContext;
struct redisReply;

namespace kvserve::frontend {

class RedisResponseStore final : public ResponseStore {
 public:
  // `url`: redis://[:PASSWORD@]HOST:PORT[/DB]; InvalidArgument naming it otherwise. Connects
  // lazily: a server that is down at start is not an error until a command needs it.
  static absl::StatusOr<std::unique_ptr<RedisResponseStore>> Create(
      const std::string& url, const ResponseStoreOptions& options);
  ~RedisResponseStore() override;

  absl::Status Put(const std::string& tenant, const std::string& id,
                   const std::string& record) override ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<std::optional<std::string>> Get(const std::string& tenant,
                                                 const std::string& id) override
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<bool> Delete(const std::string& tenant, const std::string& id) override
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Address {
    std::string host, password;
    int port = 6379, db = 0;
  };
  struct ReplyFree {
    void operator()(redisReply* r) const;
  };
  using Reply = std::unique_ptr<redisReply, ReplyFree>;

  RedisResponseStore(Address address, ResponseStoreOptions options)
      : address_(std::move(address)), options_(std::move(options)) {}
  std::string Key(const std::string& tenant, const std::string& id) const;
  absl::Status Connect() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Disconnect() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs one command (connecting first if need be; once more on a fresh connection when the
  // old one failed); an error reply is Internal with the server's message.
  absl::StatusOr<Reply> Command(const std::vector<std::string>& args) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<Reply> CommandOnce(const std::vector<std::string>& args)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Address address_;
  const ResponseStoreOptions options_;
  absl::Mutex mu_;
  redisContext* context_ ABSL_GUARDED_BY(mu_) = nullptr;
  absl::Time next_connect_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::string last_error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvserve::frontend

#endif  // KVSERVE_FRONTEND_STORE_REDIS_RESPONSE_STORE_H_
