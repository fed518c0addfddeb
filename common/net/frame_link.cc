#include "common/net/frame_link.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/string_util.h"

namespace kvserve {
namespace {

constexpr size_t kHeaderBytes = 5;  // u32 length, u8 type length
// Read in pieces of at least this much (one recv takes what a busy turn brought).
constexpr size_t kReadChunk = 256 << 10;
// One Read reads at most this much before handing out what it has (a fast peer cannot keep
// the owner's turn going forever).
constexpr size_t kMaxReadPerCall = 8 << 20;

uint32_t LoadU32(const char* p) {
  const auto* b = reinterpret_cast<const unsigned char*>(p);
  return static_cast<uint32_t>(b[0]) | static_cast<uint32_t>(b[1]) << 8 |
         static_cast<uint32_t>(b[2]) << 16 | static_cast<uint32_t>(b[3]) << 24;
}

void StoreU32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

absl::Status Errno(std::string_view what, int err) {
  return absl::UnavailableError(absl::StrCat("link ", Sv(what), ": ", std::strerror(err)));
}

void Configure(int fd) {
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  const int one = 1;
  // Replies are small and each is waited for: no Nagle delay.
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

}  // namespace

absl::StatusOr<SocketAddress> ParseSocketAddress(const std::string& host, int port) {
  SocketAddress a;
  std::string bare = host == "*" ? "0.0.0.0" : host;
  if (bare.size() > 2 && bare.front() == '[' && bare.back() == ']') {
    bare = bare.substr(1, bare.size() - 2);
  }
  if (auto* v4 = reinterpret_cast<sockaddr_in*>(&a.addr);
      inet_pton(AF_INET, bare.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<uint16_t>(port));
    a.len = sizeof(sockaddr_in);
  } else if (auto* v6 = reinterpret_cast<sockaddr_in6*>(&a.addr);
             inet_pton(AF_INET6, bare.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<uint16_t>(port));
    a.len = sizeof(sockaddr_in6);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("host \"", host, "\" is not an IP address (names are not resolved)"));
  }
  return a;
}

FrameLink::FrameLink(int fd, Options options) : fd_(fd), options_(options) { Configure(fd_); }

FrameLink::~FrameLink() {
  if (fd_ >= 0) close(fd_);
}

absl::StatusOr<std::unique_ptr<FrameLink>> FrameLink::Connect(const std::string& host, int port,
                                                              Options options) {
  if (port <= 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("link port ", port, " is out of range"));
  }
  absl::StatusOr<SocketAddress> a = ParseSocketAddress(host, port);
  if (!a.ok()) return absl::InvalidArgumentError(absl::StrCat("link ", a.status().message()));
  const sockaddr_storage& addr = a->addr;
  const socklen_t len = a->len;
  const int fd = socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return Errno("socket", errno);
  auto link = std::make_unique<FrameLink>(fd, options);
  if (connect(fd, reinterpret_cast<const sockaddr*>(&addr), len) != 0) {
    if (errno != EINPROGRESS) return Errno(absl::StrCat("connect to ", host, ":", port), errno);
    link->connecting_ = true;
  }
  RETURN_IF_ERROR(link->Queue(kHelloType, kHelloPayload));
  return link;
}

absl::Status FrameLink::Break(absl::Status why) {
  if (broken_.ok()) broken_ = std::move(why);
  return broken_;
}

char* FrameLink::Append(std::string_view type, size_t payload_bytes) {
  if (out_start_ > 0 && out_start_ == out_.size()) {  // all written: start over
    out_.clear();
    out_start_ = 0;
  }
  const size_t at = out_.size();
  out_.resize(at + kHeaderBytes + type.size() + payload_bytes);
  char* p = out_.data() + at;
  StoreU32(p, static_cast<uint32_t>(1 + type.size() + payload_bytes));
  p[4] = static_cast<char>(type.size());
  std::memcpy(p + kHeaderBytes, type.data(), type.size());
  return p + kHeaderBytes + type.size();
}

absl::Status FrameLink::Queue(std::string_view type, std::string_view payload) {
  if (broken()) return absl::FailedPreconditionError(broken_.message());
  if (type.empty() || type.size() > 255) {
    return absl::InvalidArgumentError(absl::StrCat("link message type of ", type.size(), " bytes"));
  }
  const size_t bytes = 1 + type.size() + payload.size();
  if (bytes > options_.max_message_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("a ", Sv(type), " of ", bytes,
                                                   " bytes is over the link's limit of ",
                                                   options_.max_message_bytes));
  }
  if (queued_bytes() + bytes > options_.max_queued_bytes && queued_bytes() > 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the link's peer is not reading: ", queued_bytes(), " bytes wait"));
  }
  char* p = Append(type, payload.size());
  if (!payload.empty()) std::memcpy(p, payload.data(), payload.size());
  return absl::OkStatus();
}

absl::Status FrameLink::Queue(const google::protobuf::Message& message) {
  const size_t size = message.ByteSizeLong();
  const std::string_view type = message.GetDescriptor()->name();
  if (broken() || size + 1 + type.size() > options_.max_message_bytes ||
      queued_bytes() + size > options_.max_queued_bytes) {
    return Queue(type, std::string(message.SerializeAsString()));  // its error, named
  }
  char* p = Append(type, size);
  message.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(p));
  return absl::OkStatus();
}

absl::Status FrameLink::FinishConnect() {
  int err = 0;
  socklen_t len = sizeof(err);
  if (getsockopt(fd_, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
  if (err != 0) return Break(Errno("connect", err));
  sockaddr_storage peer{};
  socklen_t peer_len = sizeof(peer);
  if (getpeername(fd_, reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0) {
    if (errno == ENOTCONN) return absl::OkStatus();  // still connecting
    return Break(Errno("connect", errno));
  }
  connecting_ = false;
  return absl::OkStatus();
}

absl::Status FrameLink::Flush() {
  if (broken()) return broken_;
  if (connecting_) {
    if (absl::Status s = FinishConnect(); !s.ok() || connecting_) return s;
  }
  while (queued_bytes() > 0) {
    const ssize_t n =
        send(fd_, out_.data() + out_start_, queued_bytes(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return absl::OkStatus();
      if (errno == EINTR) continue;
      return Break(Errno("send", errno));
    }
    out_start_ += static_cast<size_t>(n);
  }
  out_.clear();
  out_start_ = 0;
  return absl::OkStatus();
}

bool FrameLink::has_unread() const {
  const size_t have = in_end_ - in_start_;
  return have >= kHeaderBytes && have >= 4 + LoadU32(in_.data() + in_start_);
}

absl::Status FrameLink::TakeMessages(std::vector<ReceivedMessage>& out, size_t max) {
  for (size_t taken = 0; taken < max && in_end_ - in_start_ >= 4; ++taken) {
    const char* p = in_.data() + in_start_;
    const uint32_t len = LoadU32(p);
    if (len < 1 || len > options_.max_message_bytes) {
      return Break(absl::DataLossError(absl::StrCat("the link's peer sent a message of ", len,
                                                    " bytes (the limit is ",
                                                    options_.max_message_bytes, ")")));
    }
    if (in_end_ - in_start_ < 4 + size_t{len}) break;
    const size_t type_len = static_cast<unsigned char>(p[4]);
    if (type_len == 0 || 1 + type_len > len) {
      return Break(absl::DataLossError(absl::StrCat("the link's peer sent a message whose type is ",
                                                    type_len, " of ", len, " bytes")));
    }
    ReceivedMessage& m = out.emplace_back();
    m.type.assign(p + kHeaderBytes, type_len);
    m.payload.assign(p + kHeaderBytes + type_len, len - 1 - type_len);
    in_start_ += 4 + size_t{len};
  }
  return absl::OkStatus();
}

absl::Status FrameLink::Read(std::vector<ReceivedMessage>& out, size_t max_messages) {
  if (broken()) return broken_;
  const size_t before = out.size();
  RETURN_IF_ERROR(TakeMessages(out, max_messages));
  size_t read = 0;
  while (out.size() - before < max_messages && read < kMaxReadPerCall) {
    // The unread bytes moved to the start, then room for a chunk more: the buffer doubles as a
    // long message arrives, never sized ahead from its length field (a hostile peer's 5 bytes
    // would make it allocate max_message_bytes).
    if (in_start_ > 0) {
      std::memmove(in_.data(), in_.data() + in_start_, in_end_ - in_start_);
      in_end_ -= in_start_;
      in_start_ = 0;
    }
    if (in_.size() - in_end_ < kReadChunk) {
      in_.resize(std::max(2 * in_.size(), in_end_ + kReadChunk));
    }
    const ssize_t n = recv(fd_, in_.data() + in_end_, in_.size() - in_end_, MSG_DONTWAIT);
    if (n == 0) {
      return Break(absl::UnavailableError("the link's peer closed it"));
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      return Break(Errno("recv", errno));
    }
    in_end_ += static_cast<size_t>(n);
    read += static_cast<size_t>(n);
    if (absl::Status s = TakeMessages(out, max_messages - (out.size() - before)); !s.ok()) {
      return s;
    }
  }
  if (in_start_ == in_end_) {
    in_start_ = in_end_ = 0;
    // A large message's room is not kept.
    if (in_.size() > 4 * kReadChunk) std::string().swap(in_);
  }
  return absl::OkStatus();
}

}  // namespace kvserve
