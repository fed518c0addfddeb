#include "common/file_util.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace kvserve {
namespace {

absl::Status ErrnoStatus(int err, const std::string& what, const std::string& path) {
  std::string message = absl::StrCat(what, " '", path, "': ", std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(message);
  if (err == EACCES) return absl::PermissionDeniedError(message);
  return absl::InvalidArgumentError(message);
}

// Opens a regular file read-only and returns its descriptor and size.
absl::Status OpenRegular(const std::string& path, int* fd, size_t* size) {
  *fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (*fd < 0) return ErrnoStatus(errno, "cannot open", path);
  struct stat st;
  if (::fstat(*fd, &st) != 0) {
    int err = errno;
    ::close(*fd);
    return ErrnoStatus(err, "cannot stat", path);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(*fd);
    return absl::InvalidArgumentError(absl::StrCat("'", path, "' is not a regular file"));
  }
  *size = static_cast<size_t>(st.st_size);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  int fd;
  size_t size;
  if (absl::Status s = OpenRegular(path, &fd, &size); !s.ok()) return s;
  std::string out(size, '\0');
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::read(fd, out.data() + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = n < 0 ? errno : EIO;
      ::close(fd);
      return ErrnoStatus(err, "cannot read", path);
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  return out;
}

absl::Status WriteFileAtomically(const std::string& path, std::string_view content) {
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) return ErrnoStatus(errno, "cannot create", tmp);
  bool ok = std::fwrite(content.data(), 1, content.size(), f) == content.size();
  int err = errno;
  if (std::fclose(f) != 0 && ok) ok = false, err = errno;
  if (!ok) return ErrnoStatus(err, "cannot write", tmp);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return ErrnoStatus(errno, "cannot rename", tmp);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<MappedFile>> MappedFile::Open(const std::string& path) {
  int fd;
  size_t size;
  if (absl::Status s = OpenRegular(path, &fd, &size); !s.ok()) return s;
  const uint8_t* data = nullptr;
  if (size > 0) {
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      return ErrnoStatus(err, "cannot mmap", path);
    }
    data = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
  return std::unique_ptr<MappedFile>(new MappedFile(path, data, size));
}

MappedFile::~MappedFile() {
  if (size_ > 0) ::munmap(const_cast<uint8_t*>(data_), size_);
}

}  // namespace kvserve
