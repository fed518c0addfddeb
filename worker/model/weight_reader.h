// Reads a checkpoint's tensors, or row / column slices of them (a tensor-parallel rank's
// share), into host arrays of the types the model keeps: float32 for vectors (norms, biases),
// the weight type for matrices — the bytes as stored when the checkpoint already holds that
// type (a bf16 checkpoint served in bf16 is copied, not converted), else converted through
// float32 with round-to-nearest-even.
//
//   WeightReader read(*ckpt, DType::kBF16);
//   std::vector<uint8_t> qkv;
//   RETURN_IF_ERROR(read.MatrixRows("model.layers.0.self_attn.q_proj.weight", r0, r1, &qkv));
#ifndef KVSERVE_WORKER_MODEL_WEIGHT_READER_H_
#define KVSERVE_WORKER_MODEL_WEIGHT_READER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/model/dtype.h"
#include "common/model/safetensors.h"

namespace kvserve::worker {

class WeightReader {
 public:
  // `matrix_type`: kF32, kBF16 or kF16.
  WeightReader(const Checkpoint& ckpt, DType matrix_type) : ckpt_(ckpt), type_(matrix_type) {}

  // A whole 1-D (or 2-D) tensor, or its rows [r0, r1), appended as float32.
  absl::Status Vector(const std::string& name, std::vector<float>* out) const;
  absl::Status VectorRows(const std::string& name, int64_t r0, int64_t r1,
                          std::vector<float>* out) const;
  // Rows [r0, r1) of a 2-D tensor (all of them: Matrix), or columns [c0, c1) of every row,
  // appended in the matrix type.
  absl::Status Matrix(const std::string& name, std::vector<uint8_t>* out) const;
  absl::Status MatrixRows(const std::string& name, int64_t r0, int64_t r1,
                          std::vector<uint8_t>* out) const;
  absl::Status MatrixColumns(const std::string& name, int64_t c0, int64_t c1,
                             std::vector<uint8_t>* out) const;

 private:
  const Checkpoint& ckpt_;
  DType type_;
};

}  // namespace kvserve::worker

#endif  // KVSERVE_WORKER_MODEL_WEIGHT_READER_H_
