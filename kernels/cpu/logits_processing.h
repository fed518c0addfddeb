// The CPU twin of the logits adjustments (kernels/logits_processing.h); the CPU backend's
// AdjustLogits.
#ifndef KVSERVE_KERNELS_CPU_LOGITS_PROCESSING_H_
#define KVSERVE_KERNELS_CPU_LOGITS_PROCESSING_H_

#include "kernels/logits_processing.h"

namespace kvserve::kernels::cpu {

// Every adjustment of `p` (host pointers), in place.
void AdjustLogits(const AdjustLogitsParams& p);

}  // namespace kvserve::kernels::cpu

#endif  // KVSERVE_KERNELS_CPU_LOGITS_PROCESSING_H_
