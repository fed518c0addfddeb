#include "frontend/http/auth.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/string_util.h"

namespace kvserve::frontend {
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

absl::StatusOr<std::vector<std::string>> ParseApiKeys(std::string_view text,
                                                      std::string_view source) {
  std::vector<std::string> keys;
  for (absl::string_view line : absl::StrSplit(Sv(text), '\n')) {
    if (absl::StartsWith(absl::StripLeadingAsciiWhitespace(line), "#")) continue;
    for (absl::string_view key : absl::StrSplit(line, ',')) {
      key = absl::StripAsciiWhitespace(key);
      if (!key.empty()) keys.emplace_back(key);
    }
  }
  if (keys.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(Sv(source), " holds no API key"));
  }
  return keys;
}

std::string ParseToken(std::string_view text) {
  return std::string(absl::StripAsciiWhitespace(Sv(text)));
}

}  // namespace kvserve::frontend
