#include "router/auth.h"

namespace kvserve::router {
namespace {

// Whether `authorization` is "Bearer " + `token`, in time that depends on the lengths only.
bool BearerMatches(std::string_view authorization, std::string_view token) {
  constexpr std::string_view kBearer = "Bearer ";
  if (authorization.size() != kBearer.size() + token.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < kBearer.size(); ++i) diff |= authorization[i] ^ kBearer[i];
  for (size_t i = 0; i < token.size(); ++i) diff |= authorization[kBearer.size() + i] ^ token[i];
  return diff == 0;
}

}  // namespace

absl::Status CheckApiKey(const std::vector<std::string>& keys, std::string_view authorization) {
  if (keys.empty()) return absl::OkStatus();
  bool ok = false;
  for (const std::string& key : keys) ok |= BearerMatches(authorization, key);
  if (ok) return absl::OkStatus();
  return absl::UnauthenticatedError("a valid API key is required (Authorization: Bearer ...)");
}

absl::Status CheckAdminToken(const std::string& token, std::string_view authorization) {
  if (token.empty()) return absl::NotFoundError("the admin API is off (--admin-token)");
  if (BearerMatches(authorization, token)) return absl::OkStatus();
  return absl::UnauthenticatedError("admin token required");
}

}  // namespace kvserve::router
