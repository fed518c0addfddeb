#include "kernels/rope.h"

#include <cmath>

namespace kvserve::kernels {

std::vector<float> RopeInvFreq(const RopeConfig& rope, int head_dim) {
  std::vector<float> inv(head_dim / 2);
  for (int i = 0; i < head_dim / 2; ++i) {
    // transformers: 1.0 / (base ** (arange(0, dim, 2).float() / dim)), in float32.
    float exponent = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    inv[i] = 1.0f / std::pow(static_cast<float>(rope.theta), exponent);
  }
  if (rope.type == "linear") {
    for (float& f : inv) f = f / static_cast<float>(rope.factor);
  } else if (rope.type == "llama3") {
    const double old_len = static_cast<double>(rope.original_max_position_embeddings);
    const double low_wavelen = old_len / rope.low_freq_factor;
    const double high_wavelen = old_len / rope.high_freq_factor;
    for (float& f : inv) {
      const double wavelen = 2.0 * M_PI / f;
      if (wavelen < high_wavelen) continue;
      if (wavelen > low_wavelen) {
        f = static_cast<float>(f / rope.factor);
        continue;
      }
      const double smooth = (old_len / wavelen - rope.low_freq_factor) /
                            (rope.high_freq_factor - rope.low_freq_factor);
      f = static_cast<float>((1.0 - smooth) * f / rope.factor + smooth * f);
    }
  }
  return inv;
}

}  // namespace kvserve::kernels
