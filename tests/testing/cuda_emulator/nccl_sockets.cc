#include "tests/testing/cuda_emulator/nccl_sockets.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace kvserve::emulation {
namespace {

constexpr int kPollMillis = 50;

struct Hello {
  int32_t rank;
  int32_t pid;
};

// The abstract socket (no file) named after the id's first 32 bytes, and its length.
struct Address {
  explicit Address(std::string_view id) {
    a.sun_family = AF_UNIX;
    std::string name = "kvserve-emulated-nccl-";
    for (unsigned char c : id.substr(0, 32)) {
      name += "0123456789abcdef"[c >> 4];
      name += "0123456789abcdef"[c & 15];
    }
    std::memcpy(a.sun_path + 1, name.data(), name.size());  // sun_path[0] = 0: abstract
    length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  }
  const sockaddr* get() const { return reinterpret_cast<const sockaddr*>(&a); }

  sockaddr_un a{};
  socklen_t length = 0;
};

int NewSocket() {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  return fd;
}

// Waits for `events` on fd until `deadline`; false past it or on error.
bool Wait(int fd, short events, absl::Time deadline) {
  while (absl::Now() < deadline) {
    pollfd p{.fd = fd, .events = events, .revents = 0};
    const int n = poll(&p, 1, kPollMillis);
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) return false;
  }
  return false;
}

absl::StatusOr<std::shared_ptr<PeerSocket>> Connect(std::string_view id, absl::Time deadline) {
  const Address a(id);
  while (absl::Now() < deadline) {
    const int fd = NewSocket();
    if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
    if (connect(fd, a.get(), a.length) == 0) {
      return std::make_shared<PeerSocket>(fd);
    }
    const int err = errno;
    if (err == EINPROGRESS || err == EAGAIN) {  // a Unix socket's backlog is full: try again
      close(fd);
    } else {
      close(fd);
      if (err != ECONNREFUSED && err != ENOENT) {
        return absl::InternalError(absl::StrCat("connect: ", std::strerror(err)));
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // rank 0 is not listening yet
  }
  return absl::UnavailableError("emulated NCCL: rank 0 of the communicator never came");
}

absl::StatusOr<Mesh> Listen(std::string_view id, int nranks, absl::Time deadline) {
  const int listener = NewSocket();
  if (listener < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  const Address a(id);
  if (bind(listener, a.get(), a.length) != 0 || listen(listener, nranks) != 0) {
    const std::string why = std::strerror(errno);
    close(listener);
    return absl::InternalError(absl::StrCat("emulated NCCL: listen: ", why));
  }
  Mesh mesh;
  mesh.peers.resize(nranks);
  for (int joined = 1; joined < nranks;) {
    if (!Wait(listener, POLLIN, deadline)) break;
    const int fd = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) continue;
    auto peer = std::make_shared<PeerSocket>(fd);
    Hello hello{};
    if (!peer->ReadAll(&hello, sizeof(hello), deadline) || hello.rank < 1 || hello.rank >= nranks ||
        mesh.peers[hello.rank] != nullptr) {
      continue;  // not one of ours: dropped
    }
    mesh.one_process = mesh.one_process && hello.pid == getpid();
    mesh.peers[hello.rank] = std::move(peer);
    ++joined;
  }
  close(listener);
  for (int r = 1; r < nranks; ++r) {
    if (mesh.peers[r] == nullptr) {
      return absl::UnavailableError(
          absl::StrCat("emulated NCCL: rank ", r, " of ", nranks, " never joined"));
    }
  }
  const uint8_t one = mesh.one_process ? 1 : 0;
  for (int r = 1; r < nranks; ++r) mesh.peers[r]->WriteAll(&one, 1);
  return mesh;
}

}  // namespace

PeerSocket::~PeerSocket() { close(fd_); }

void PeerSocket::Break() {
  broken_ = true;
  shutdown(fd_, SHUT_RDWR);
}

bool PeerSocket::WriteAll(const void* data, size_t bytes) {
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0 && !broken_) {
    const ssize_t n = send(fd_, p, bytes, MSG_NOSIGNAL);
    if (n > 0) {
      p += n;
      bytes -= n;
    } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      pollfd w{.fd = fd_, .events = POLLOUT, .revents = 0};
      poll(&w, 1, kPollMillis);
    } else {
      broken_ = true;
    }
  }
  return !broken_;
}

bool PeerSocket::ReadAll(void* data, size_t bytes, absl::Time deadline) {
  auto* p = static_cast<char*>(data);
  while (bytes > 0 && !broken_) {
    const ssize_t n = recv(fd_, p, bytes, 0);
    if (n > 0) {
      p += n;
      bytes -= n;
    } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      if (absl::Now() > deadline) return false;
      pollfd r{.fd = fd_, .events = POLLIN, .revents = 0};
      poll(&r, 1, kPollMillis);
    } else {
      broken_ = true;  // closed by the peer (0) or failed
    }
  }
  return !broken_;
}

absl::StatusOr<Mesh> JoinMesh(std::string_view id, int nranks, int rank, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  if (nranks == 1) return Mesh{.peers = {nullptr}, .one_process = true};
  if (rank == 0) return Listen(id, nranks, deadline);
  ASSIGN_OR_RETURN(std::shared_ptr<PeerSocket> root, Connect(id, deadline));
  const Hello hello{.rank = rank, .pid = getpid()};
  uint8_t one = 0;
  if (!root->WriteAll(&hello, sizeof(hello)) || !root->ReadAll(&one, 1, deadline)) {
    return absl::UnavailableError("emulated NCCL: rank 0 dropped the connection while joining");
  }
  return Mesh{.peers = {std::move(root)}, .one_process = one == 1};
}

}  // namespace kvserve::emulation
