// Status propagation macros. Debian's Abseil (20220623) has no ABSL_RETURN_IF_ERROR or
// ASSIGN_OR_RETURN, so kvserve defines them once here.
//
//   absl::StatusOr<Config> LoadConfig(const std::string& path) {
//     ASSIGN_OR_RETURN(std::string text, ReadFile(path));
//     RETURN_IF_ERROR(Validate(text));
//     return Parse(text);
//   }
//
// Both evaluate their argument exactly once. ASSIGN_OR_RETURN's left side may declare a
// variable (`Type name`) or name an existing one; it must not contain unparenthesized commas.
#ifndef KVSERVE_COMMON_STATUS_MACROS_H_
#define KVSERVE_COMMON_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

#define RETURN_IF_ERROR(expr)                          \
  do {                                                 \
    ::absl::Status kvserve_status_ = (expr);           \
    if (!kvserve_status_.ok()) return kvserve_status_; \
  } while (0)

#define KVSERVE_CONCAT_INNER_(a, b) a##b
#define KVSERVE_CONCAT_(a, b) KVSERVE_CONCAT_INNER_(a, b)

#define ASSIGN_OR_RETURN(lhs, rexpr) \
  KVSERVE_ASSIGN_OR_RETURN_IMPL_(KVSERVE_CONCAT_(kvserve_statusor_, __LINE__), lhs, rexpr)

#define KVSERVE_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                   \
  if (!statusor.ok()) return std::move(statusor).status();   \
  lhs = std::move(statusor).value()

namespace kvserve {

// Prefixes a status message with context, keeping its code: "loading model.safetensors: ...".
inline absl::Status Annotate(const absl::Status& status, std::string_view context) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(absl::string_view(context.data(), context.size()),
                                                  ": ", status.message()));
}

}  // namespace kvserve

#endif  // KVSERVE_COMMON_STATUS_MACROS_H_
