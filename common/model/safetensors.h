// Reads Hugging Face safetensors checkpoints by memory-mapping them: one file, or a sharded
// checkpoint described by `model.safetensors.index.json`. Every offset in an untrusted file is
// validated at open time, so tensor accessors never read out of bounds.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt, Checkpoint::Open("/models/llama"));
//   ASSIGN_OR_RETURN(const TensorInfo* w, ckpt->Find("model.embed_tokens.weight"));
//   std::vector<float> values = w->ToFloat32();
//
// Errors are InvalidArgument and name the file and, where there is one, the tensor:
// truncated files, headers over 100 MB or past the end, malformed JSON, unknown dtypes, shapes
// that disagree with the byte range, ranges out of bounds or overlapping.
// Thread-compatible: read-only after Open.
#ifndef KVSERVE_COMMON_MODEL_SAFETENSORS_H_
#define KVSERVE_COMMON_MODEL_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/file_util.h"
#include "common/model/dtype.h"

namespace kvserve {

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  absl::Span<const uint8_t> bytes;  // inside the owning file's map; may be unaligned
  std::string file;                 // path of the file holding it

  [[nodiscard]] int64_t NumElements() const;
  // Converts F32 / F16 / BF16 / F8_E4M3 data to float32. CHECK-fails for integer dtypes:
  // callers check dtype first (a model loader rejects integer weights with a clear error).
  [[nodiscard]] std::vector<float> ToFloat32() const;
};

// One safetensors file.
class SafetensorsFile {
 public:
  static constexpr uint64_t kMaxHeaderBytes = 100u << 20;

  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);

  [[nodiscard]] const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  [[nodiscard]] const std::map<std::string, std::string>& metadata() const { return metadata_; }
  [[nodiscard]] const std::string& path() const { return file_->path(); }

 private:
  explicit SafetensorsFile(std::unique_ptr<MappedFile> file) : file_(std::move(file)) {}
  absl::Status Parse();

  std::unique_ptr<MappedFile> file_;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// A model directory's weights: `model.safetensors.index.json` with its shards if present,
// else `model.safetensors`.
class Checkpoint {
 public:
  static absl::StatusOr<std::unique_ptr<Checkpoint>> Open(const std::string& dir);

  // NotFound naming the tensor if the checkpoint has no such tensor.
  [[nodiscard]] absl::StatusOr<const TensorInfo*> Find(const std::string& name) const;
  [[nodiscard]] const std::map<std::string, const TensorInfo*>& tensors() const { return tensors_; }
  [[nodiscard]] int64_t TotalBytes() const;

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorInfo*> tensors_;
};

// A tensor to write: `bytes` must hold exactly NumElements(shape) * DTypeSize(dtype) bytes.
struct TensorToWrite {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::string_view bytes;
};

// Writes a safetensors file (tensors laid out in the given order, 8-byte aligned header).
// InvalidArgument for a size mismatch or a duplicate name; Internal if the file cannot be
// written.
absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                              const std::map<std::string, std::string>& metadata = {});

}  // namespace kvserve

#endif  // KVSERVE_COMMON_MODEL_SAFETENSORS_H_
