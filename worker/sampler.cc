#include "worker/sampler.h"

namespace kvserve::worker {

kernels::SampleRequest MakeSampleRequest(const SamplingParams& params, uint64_t seed, int64_t step,
                                         int32_t row) {
  kernels::SampleRequest r;
  r.row = row;
  r.temperature = params.temperature;
  r.top_k = params.top_k;
  r.top_p = params.top_p;
  r.min_p = params.min_p;
  r.seed = seed;
  r.step = step;
  return r;
}

}  // namespace kvserve::worker
