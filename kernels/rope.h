// Rotary-embedding inverse frequencies for the rope types kvserve supports, computed the way
// transformers does (float32): default, linear (frequencies / factor) and llama3
// (frequency-dependent: long wavelengths scaled by 1/factor, short ones kept, a smooth blend
// between).
//
//   std::vector<float> inv_freq = RopeInvFreq(config.rope, config.head_dim);
#ifndef KVSERVE_KERNELS_ROPE_H_
#define KVSERVE_KERNELS_ROPE_H_

#include <vector>

#include "common/model/hf_config.h"

namespace kvserve::kernels {

std::vector<float> RopeInvFreq(const RopeConfig& rope, int head_dim);

}  // namespace kvserve::kernels

#endif  // KVSERVE_KERNELS_ROPE_H_
