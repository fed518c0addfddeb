#include "worker/model/weight_reader.h"

#include <algorithm>
#include <cstring>

#include "common/status_macros.h"

namespace kvserve::worker {
namespace {

// Elements [begin, end) of `t` as float32 into dst.
void ToFloat(const TensorInfo& t, int64_t begin, int64_t end, float* dst) {
  const uint8_t* p = t.bytes.data();
  const int64_t n = end - begin;
  switch (t.dtype) {
    case DType::kF32:
      std::memcpy(dst, p + begin * 4, n * 4);
      break;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) {
        const int64_t k = 2 * (begin + i);
        dst[i] = F16ToFloat(static_cast<uint16_t>(p[k] | (p[k + 1] << 8)));
      }
      break;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        const int64_t k = 2 * (begin + i);
        dst[i] = Bf16ToFloat(static_cast<uint16_t>(p[k] | (p[k + 1] << 8)));
      }
      break;
    default:  // F8_E4M3 (CheckWeights has refused integer types)
      for (int64_t i = 0; i < n; ++i) dst[i] = F8E4M3ToFloat(p[begin + i]);
      break;
  }
}

// Elements [begin, end) of `t` appended to `out` as `type`: copied when stored so, converted
// otherwise (in chunks, so no whole-tensor float copy is made).
void AppendAs(const TensorInfo& t, int64_t begin, int64_t end, DType type,
              std::vector<uint8_t>* out) {
  const size_t size = DTypeSize(type);
  const size_t at = out->size();
  out->resize(at + (end - begin) * size);
  uint8_t* dst = out->data() + at;
  if (t.dtype == type) {
    std::memcpy(dst, t.bytes.data() + begin * size, (end - begin) * size);
    return;
  }
  float chunk[4096];
  for (int64_t i = begin; i < end; i += 4096) {
    const int64_t n = std::min<int64_t>(4096, end - i);
    ToFloat(t, i, i + n, chunk);
    if (type == DType::kF32) {
      std::memcpy(dst, chunk, n * 4);
    } else {
      for (int64_t k = 0; k < n; ++k) {
        const uint16_t h = type == DType::kBF16 ? FloatToBf16(chunk[k]) : FloatToF16(chunk[k]);
        std::memcpy(dst + 2 * k, &h, 2);
      }
    }
    dst += n * size;
  }
}

int64_t Columns(const TensorInfo& t) { return t.shape.size() == 2 ? t.shape[1] : 1; }

}  // namespace

absl::Status WeightReader::Vector(const std::string& name, std::vector<float>* out) const {
  ASSIGN_OR_RETURN(const TensorInfo* t, ckpt_.Find(name));
  return VectorRows(name, 0, t->shape[0], out);
}

absl::Status WeightReader::VectorRows(const std::string& name, int64_t r0, int64_t r1,
                                      std::vector<float>* out) const {
  ASSIGN_OR_RETURN(const TensorInfo* t, ckpt_.Find(name));
  const int64_t cols = Columns(*t);
  const size_t at = out->size();
  out->resize(at + (r1 - r0) * cols);
  ToFloat(*t, r0 * cols, r1 * cols, out->data() + at);
  return absl::OkStatus();
}

absl::Status WeightReader::Matrix(const std::string& name, std::vector<uint8_t>* out) const {
  ASSIGN_OR_RETURN(const TensorInfo* t, ckpt_.Find(name));
  return MatrixRows(name, 0, t->shape[0], out);
}

absl::Status WeightReader::MatrixRows(const std::string& name, int64_t r0, int64_t r1,
                                      std::vector<uint8_t>* out) const {
  ASSIGN_OR_RETURN(const TensorInfo* t, ckpt_.Find(name));
  const int64_t cols = Columns(*t);
  AppendAs(*t, r0 * cols, r1 * cols, type_, out);
  return absl::OkStatus();
}

absl::Status WeightReader::MatrixColumns(const std::string& name, int64_t c0, int64_t c1,
                                         std::vector<uint8_t>* out) const {
  ASSIGN_OR_RETURN(const TensorInfo* t, ckpt_.Find(name));
  const int64_t cols = Columns(*t);
  out->reserve(out->size() + t->shape[0] * (c1 - c0) * DTypeSize(type_));
  for (int64_t r = 0; r < t->shape[0]; ++r) AppendAs(*t, r * cols + c0, r * cols + c1, type_, out);
  return absl::OkStatus();
}

}  // namespace kvserve::worker
