// A byte pipe between the devices of two processes: the KV transfer's device-to-device path
// between a prefill and a decode worker (docs/DISAGGREGATION.md). NCCL's send and receive on
// CUDA (kernels/cuda/nccl_peer_link.h); the CPU backend has none (its KV moves over the
// authenticated router links). One side sends while the other receives the same sizes in the
// same order; the bytes are not checked here (the caller fingerprints them at both ends).
//
//   RETURN_IF_ERROR(link.Send(ranges));      // on the prefill worker (or StartSend, PollSend)
//   RETURN_IF_ERROR(link.Receive(ranges));   // on the decode worker, the same sizes
//
// Used by one thread at a time (the engine thread).
#ifndef KVSERVE_KERNELS_PEER_LINK_H_
#define KVSERVE_KERNELS_PEER_LINK_H_

#include <memory>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/backend.h"

namespace kvserve::kernels {

class PeerLink {
 public:
  virtual ~PeerLink() = default;
  [[nodiscard]] virtual std::string_view name() const = 0;

  // Each range of device memory, in order; returns once the peer has them all (Send) or they
  // are all here (Receive). The ops issued to the backend before must be done
  // (Backend::Synchronize). DeadlineExceeded when the transfer outlives the link's timeout,
  // Unavailable when the peer is gone: either way the link is aborted, what was received is
  // garbage, and every later call returns the same error.
  virtual absl::Status Send(absl::Span<const ByteRange> ranges) = 0;
  virtual absl::Status Receive(absl::Span<const ByteRange> ranges) = 0;

  // Send in two halves, for a caller that goes on with its work meanwhile: StartSend queues
  // the ranges and returns; PollSend is true once the peer has every send queued so far (or
  // none is in flight), false while they are on their way, and an error, as above, when one
  // failed or outlived the timeout. Sends queue behind one another in order. With `after`,
  // the ranges go once the ops queued on that backend so far are done (a layer's KV as the
  // compute that writes it ends), so the caller need not Synchronize. The ranges must not
  // change until PollSend is true. FailedPrecondition while receives are in flight.
  virtual absl::Status StartSend(absl::Span<const ByteRange> ranges, Backend* after) = 0;
  absl::Status StartSend(absl::Span<const ByteRange> ranges) { return StartSend(ranges, nullptr); }
  virtual absl::StatusOr<bool> PollSend() = 0;

  // Receive in two halves, for a caller that must not wait for the peer (a decode worker's
  // loop): StartReceive queues the ranges (receives queue in order, as sends do) and PollReceive
  // says, as PollSend does, when every one queued has arrived. The ranges must not be read
  // before. FailedPrecondition while sends are in flight.
  virtual absl::Status StartReceive(absl::Span<const ByteRange> ranges) = 0;
  virtual absl::StatusOr<bool> PollReceive() = 0;
};

// PollSend over a link per tensor-parallel rank: true once every send is done, the first error
// when one failed.
inline absl::StatusOr<bool> PollSends(absl::Span<const std::unique_ptr<PeerLink>> links) {
  bool done = true;
  for (const std::unique_ptr<PeerLink>& link : links) {
    absl::StatusOr<bool> one = link->PollSend();
    if (!one.ok()) return one.status();
    done = done && *one;
  }
  return done;
}

}  // namespace kvserve::kernels

#endif  // KVSERVE_KERNELS_PEER_LINK_H_
