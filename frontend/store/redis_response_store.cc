// The Responses store in Redis or Valkey (redis_response_store.h), over hiredis.
#include "frontend/store/redis_response_store.h"

#include <hiredis/hiredis.h>
#include <sys/time.h>

#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"

namespace kvserve::frontend {
namespace {

timeval TimevalOf(absl::Duration d) {
  const int64_t us = absl::ToInt64Microseconds(d);
  return {.tv_sec = static_cast<time_t>(us / 1000000),
          .tv_usec = static_cast<suseconds_t>(us % 1000000)};
}

}  // namespace

void RedisResponseStore::ReplyFree::operator()(redisReply* r) const { freeReplyObject(r); }

absl::StatusOr<std::unique_ptr<RedisResponseStore>> RedisResponseStore::Create(
    const std::string& url, const ResponseStoreOptions& options) {
  const auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("--responses-store '", url.substr(0, 200), "': ",
                                                   why, " (redis://[:PASSWORD@]HOST:PORT[/DB])"));
  };
  absl::string_view rest = url;
  if (!absl::ConsumePrefix(&rest, "redis://")) return bad("is not a redis:// URL");
  Address a;
  if (const size_t at = rest.rfind('@'); at != absl::string_view::npos) {
    absl::string_view auth = rest.substr(0, at);
    if (!absl::ConsumePrefix(&auth, ":")) return bad("the password must follow ':'");
    a.password = std::string(auth);
    rest.remove_prefix(at + 1);
  }
  if (const size_t slash = rest.find('/'); slash != absl::string_view::npos) {
    if (!absl::SimpleAtoi(rest.substr(slash + 1), &a.db) || a.db < 0) {
      return bad("the database must be a number");
    }
    rest = rest.substr(0, slash);
  }
  const size_t colon = rest.rfind(':');
  if (colon == absl::string_view::npos || colon == 0) return bad("needs HOST:PORT");
  if (!absl::SimpleAtoi(rest.substr(colon + 1), &a.port) || a.port <= 0 || a.port > 65535) {
    return bad("the port must be 1-65535");
  }
  a.host = std::string(rest.substr(0, colon));
  if (a.host.size() > 2 && a.host.front() == '[' && a.host.back() == ']') {
    a.host = a.host.substr(1, a.host.size() - 2);
  }
  return std::unique_ptr<RedisResponseStore>(new RedisResponseStore(std::move(a), options));
}

RedisResponseStore::~RedisResponseStore() {
  absl::MutexLock lock(&mu_);
  Disconnect();
}

std::string RedisResponseStore::Key(const std::string& tenant, const std::string& id) const {
  return absl::StrCat(options_.key_prefix, tenant, ":", id);
}

void RedisResponseStore::Disconnect() {
  if (context_ != nullptr) redisFree(context_);
  context_ = nullptr;
}

absl::Status RedisResponseStore::Connect() {
  const std::string where = absl::StrCat(address_.host, ":", address_.port);
  if (absl::Now() < next_connect_) {
    return absl::UnavailableError(absl::StrCat("the Responses store at ", where,
                                               " (retried within a second): ", last_error_));
  }
  context_ =
      redisConnectWithTimeout(address_.host.c_str(), address_.port, TimevalOf(options_.timeout));
  if (context_ == nullptr || context_->err != 0) {
    last_error_ = context_ != nullptr ? context_->errstr : "out of memory";
    Disconnect();
    next_connect_ = absl::Now() + absl::Seconds(1);
    return absl::UnavailableError(
        absl::StrCat("the Responses store at ", where, ": ", last_error_));
  }
  redisSetTimeout(context_, TimevalOf(options_.timeout));
  if (!address_.password.empty()) {
    RETURN_IF_ERROR(CommandOnce({"AUTH", address_.password}).status());
  }
  if (address_.db != 0) {
    RETURN_IF_ERROR(CommandOnce({"SELECT", absl::StrCat(address_.db)}).status());
  }
  return absl::OkStatus();
}

absl::StatusOr<RedisResponseStore::Reply> RedisResponseStore::CommandOnce(
    const std::vector<std::string>& args) {
  std::vector<const char*> argv;
  std::vector<size_t> lengths;
  for (const std::string& a : args) {
    argv.push_back(a.data());
    lengths.push_back(a.size());
  }
  Reply reply(static_cast<redisReply*>(
      redisCommandArgv(context_, static_cast<int>(args.size()), argv.data(), lengths.data())));
  if (reply == nullptr) {
    const std::string why = context_->errstr;
    Disconnect();
    return absl::UnavailableError(
        absl::StrCat("the Responses store at ", address_.host, ":", address_.port, ": ", why));
  }
  if (reply->type == REDIS_REPLY_ERROR) {
    return absl::InternalError(absl::StrCat("the Responses store answered ", args[0], ": ",
                                            std::string(reply->str, reply->len)));
  }
  return reply;
}

absl::StatusOr<RedisResponseStore::Reply> RedisResponseStore::Command(
    const std::vector<std::string>& args) {
  absl::MutexLock lock(&mu_);
  const bool fresh = context_ == nullptr;
  if (fresh) RETURN_IF_ERROR(Connect());
  absl::StatusOr<Reply> reply = CommandOnce(args);
  if (reply.ok() || fresh || context_ != nullptr) return reply;
  // The connection made earlier broke (the server restarted, an idle timeout): once more.
  RETURN_IF_ERROR(Connect());
  return CommandOnce(args);
}

absl::Status RedisResponseStore::Put(const std::string& tenant, const std::string& id,
                                     const std::string& record) {
  return Command({"SET", Key(tenant, id), record, "PX",
                  absl::StrCat(absl::ToInt64Milliseconds(options_.ttl))})
      .status();
}

absl::StatusOr<std::optional<std::string>> RedisResponseStore::Get(const std::string& tenant,
                                                                   const std::string& id) {
  ASSIGN_OR_RETURN(Reply reply, Command({"GET", Key(tenant, id)}));
  if (reply->type == REDIS_REPLY_NIL) return std::optional<std::string>();
  if (reply->type != REDIS_REPLY_STRING) {
    return absl::InternalError("the Responses store answered GET with something not a string");
  }
  return std::optional<std::string>(std::string(reply->str, reply->len));
}

absl::StatusOr<bool> RedisResponseStore::Delete(const std::string& tenant, const std::string& id) {
  ASSIGN_OR_RETURN(Reply reply, Command({"DEL", Key(tenant, id)}));
  return reply->type == REDIS_REPLY_INTEGER && reply->integer > 0;
}

}  // namespace kvserve::frontend
