#include "kernels/cuda/op_times.h"

#include "kernels/cuda/device/cuda_check.h"

namespace kvserve::kernels::cuda {

cudaEvent_t OpTimes::NewEvent() {
  if (!spare_.empty()) {
    cudaEvent_t e = spare_.back();
    spare_.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  KVSERVE_CUDA_CHECK(cudaEventCreate(&e));  // with timing
  return e;
}

std::map<std::string, Backend::OpTime> OpTimes::Take() {
  std::map<std::string, Backend::OpTime> by_op;
  for (const Span& s : spans_) {
    KVSERVE_CUDA_CHECK(cudaEventSynchronize(s.end));
    float ms = 0;
    KVSERVE_CUDA_CHECK(cudaEventElapsedTime(&ms, s.begin, s.end));
    Backend::OpTime& t = by_op[s.op];
    t.ms += ms;
    ++t.count;
    spare_.push_back(s.begin);
    spare_.push_back(s.end);
  }
  spans_.clear();
  return by_op;
}

void OpTimes::Release() {
  for (const Span& s : spans_) {
    cudaEventSynchronize(s.end);
    spare_.push_back(s.begin);
    spare_.push_back(s.end);
  }
  spans_.clear();
  for (cudaEvent_t e : spare_) cudaEventDestroy(e);
  spare_.clear();
}

OpTimes::Scope::Scope(OpTimes& t, const char* op, cudaStream_t stream, bool capturing) {
  if (!t.on_ || capturing) return;
  times_ = &t;
  stream_ = stream;
  Span s{op, t.NewEvent(), t.NewEvent()};
  KVSERVE_CUDA_CHECK(cudaEventRecord(s.begin, stream));
  span_ = t.spans_.size();
  t.spans_.push_back(s);
}

OpTimes::Scope::~Scope() {
  if (times_ != nullptr) KVSERVE_CUDA_CHECK(cudaEventRecord(times_->spans_[span_].end, stream_));
}

}  // namespace kvserve::kernels::cuda
