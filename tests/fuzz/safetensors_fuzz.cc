// safetensors headers: arbitrary bytes as a .safetensors file. The file opens with tensors
// that lie inside it, or is refused with an error naming it; float tensors convert.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/kvserve-fuzz-" + std::to_string(getpid()) + ".safetensors";
  FILE* f = fopen(path.c_str(), "wb");
  if (f == nullptr) abort();
  if (size > 0 && fwrite(data, 1, size, f) != size) abort();
  fclose(f);
  auto file = kvserve::SafetensorsFile::Open(path);
  if (!file.ok()) return 0;
  for (const auto& [name, t] : (*file)->tensors()) {
    const int64_t n = t.NumElements();
    if (n < 0) abort();
    const bool is_float = t.dtype == kvserve::DType::kF32 || t.dtype == kvserve::DType::kF16 ||
                          t.dtype == kvserve::DType::kBF16 || t.dtype == kvserve::DType::kF8E4M3;
    if (n <= 4096 && is_float) (void)t.ToFloat32();
  }
  return 0;
}
