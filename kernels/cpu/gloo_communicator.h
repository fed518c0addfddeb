// Gloo (the CPU collectives PyTorch uses) behind kernels::Communicator, for tensor-parallel
// ranks running as threads of one worker process, connected over loopback TCP through an
// in-memory rendezvous store.
//
//   ASSIGN_OR_RETURN(std::vector<std::unique_ptr<Communicator>> comms,
//                    CreateGlooGroup(/*size=*/4, absl::Seconds(30)));
#ifndef KVSERVE_KERNELS_CPU_GLOO_COMMUNICATOR_H_
#define KVSERVE_KERNELS_CPU_GLOO_COMMUNICATOR_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kernels/communicator.h"

namespace kvserve::kernels {

// Connects `size` ranks (in parallel threads, as Gloo's full-mesh rendezvous needs) and returns
// one communicator per rank. `timeout` bounds every later collective. Unavailable if the
// loopback connections cannot be made.
absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> CreateGlooGroup(int size,
                                                                           absl::Duration timeout);

}  // namespace kvserve::kernels

#endif  // KVSERVE_KERNELS_CPU_GLOO_COMMUNICATOR_H_
