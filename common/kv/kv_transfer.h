// Names the router and the workers share for the KV transfer (docs/DISAGGREGATION.md): the
// reason label of a chunk that failed, from the status it failed with.
#ifndef KVSERVE_COMMON_KV_KV_TRANSFER_H_
#define KVSERVE_COMMON_KV_KV_TRANSFER_H_

#include <array>
#include <string_view>

#include "absl/status/status.h"

namespace kvserve {

// "checksum" (DataLoss: a block's bytes changed on the way), "mismatch" (FailedPrecondition:
// another prompt, salt, format or TP size, or a chain without its parent), "no_room"
// (ResourceExhausted), "malformed" (InvalidArgument), "unsupported" (Unimplemented: a device or
// layout that moves no KV), "timeout" (DeadlineExceeded), "unavailable" (Unavailable: a peer gone
// or draining), "evicted" (NotFound: the source no longer caches the blocks), and "error" for
// anything else.
constexpr std::string_view KvTransferFailureReason(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kDataLoss:
      return "checksum";
    case absl::StatusCode::kFailedPrecondition:
      return "mismatch";
    case absl::StatusCode::kResourceExhausted:
      return "no_room";
    case absl::StatusCode::kInvalidArgument:
      return "malformed";
    case absl::StatusCode::kUnimplemented:
      return "unsupported";
    case absl::StatusCode::kDeadlineExceeded:
      return "timeout";
    case absl::StatusCode::kUnavailable:
      return "unavailable";
    case absl::StatusCode::kNotFound:
      return "evicted";
    default:
      return "error";
  }
}

// Every name KvTransferFailureReason gives, for metrics that start each series at 0.
inline constexpr std::array<std::string_view, 9> kKvTransferFailureReasons = {
    "checksum", "mismatch",    "no_room", "malformed", "unsupported",
    "timeout",  "unavailable", "evicted", "error"};

}  // namespace kvserve

#endif  // KVSERVE_COMMON_KV_KV_TRANSFER_H_
