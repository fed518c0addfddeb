// NCCL behind kernels::Communicator for the CUDA backend: one communicator per rank (one GPU
// each), buffers in device memory. The blocking collectives run on the communicator's own
// stream and are waited for with a watchdog: past the timeout the communicator is aborted and
// the call returns DeadlineExceeded, so a stalled peer never hangs the worker. The model's
// per-layer all-reduces and its logits' all-gather are stream-ordered instead (Enqueue* on the
// backend's stream: no host round trip per layer); a watchdog thread polls those collectives'
// events and aborts the same way, the error coming back from the rank's next call. Recorded in a
// CUDA graph (decode graphs), they run in its replays, which EnqueueWatch hands to the watchdog
// as a whole. (NCCL refuses two ranks on one GPU, so a single machine with one GPU can only test
// size 1; the emulated build runs more.)
//
//   ASSIGN_OR_RETURN(auto comms, CreateNcclGroup({0, 1}, absl::Seconds(30)));
//
// This header includes no CUDA header.
#ifndef KVSERVE_KERNELS_CUDA_NCCL_COMMUNICATOR_H_
#define KVSERVE_KERNELS_CUDA_NCCL_COMMUNICATOR_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kernels/communicator.h"

namespace kvserve::kernels {

// One communicator per device in `devices` (ranks in that order), made from threads of this
// process. Unavailable when CUDA or NCCL cannot initialize (no device, driver mismatch).
absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> CreateNcclGroup(
    const std::vector<int>& devices, absl::Duration timeout);

// Number of CUDA devices, 0 when there are none or the driver is unusable.
int CudaDeviceCount();

}  // namespace kvserve::kernels

#endif  // KVSERVE_KERNELS_CUDA_NCCL_COMMUNICATOR_H_
