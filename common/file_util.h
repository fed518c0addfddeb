// Reading files: whole-file reads for small text files (configs, JSON) and read-only memory
// maps for large binary ones (safetensors checkpoints); whole-file writes that readers never
// see half done. Thread-compatible: a MappedFile may be
// read from any number of threads once created.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> file, MappedFile::Open(path));
//   absl::Span<const uint8_t> bytes = file->bytes();
#ifndef KVSERVE_COMMON_FILE_UTIL_H_
#define KVSERVE_COMMON_FILE_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace kvserve {

// Reads a whole file. NotFound if it does not exist; InvalidArgument if it is not a regular file.
absl::StatusOr<std::string> ReadFileToString(const std::string& path);

// Writes `content` to path + ".tmp", then renames it over `path`, so that a reader sees the old
// file or the whole new one. An error naming the file when either step fails.
absl::Status WriteFileAtomically(const std::string& path, std::string_view content);

// A read-only, private memory map of a whole file. An empty file maps to an empty span.
class MappedFile {
 public:
  static absl::StatusOr<std::unique_ptr<MappedFile>> Open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  [[nodiscard]] absl::Span<const uint8_t> bytes() const { return {data_, size_}; }
  [[nodiscard]] const std::string& path() const { return path_; }

 private:
  MappedFile(std::string path, const uint8_t* data, size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}

  std::string path_;
  const uint8_t* data_;
  size_t size_;
};

}  // namespace kvserve

#endif  // KVSERVE_COMMON_FILE_UTIL_H_
