#include "worker/server/link_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/string_util.h"
#include "glog/logging.h"

namespace kvserve::worker {
namespace {

// "\0link" and an 8-byte connection number.
constexpr std::string_view kIdentityPrefix{"\0link", 5};
constexpr size_t kIdentityBytes = kIdentityPrefix.size() + 8;
// Connections past this are closed at once (routers are few; a peer that opens connections and
// never greets holds no more than this).
constexpr size_t kMaxConnections = 1024;

std::string Identity(uint64_t n) {
  std::string id(kIdentityPrefix);
  for (int i = 0; i < 8; ++i) id.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  return id;
}

absl::Status CannotListen(const std::string& host, int port, std::string_view what) {
  return absl::UnavailableError(absl::StrCat("--link-port: cannot listen on ", host, ":", port,
                                             " (", Sv(what), ": ", std::strerror(errno), ")"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<LinkServer>> LinkServer::Listen(const std::string& host, int port,
                                                               FrameLink::Options options) {
  absl::StatusOr<SocketAddress> a = ParseSocketAddress(host, port);
  if (!a.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--link-port: the worker's ", a.status().message()));
  }
  sockaddr_storage& addr = a->addr;
  const socklen_t len = a->len;
  const int fd = socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return CannotListen(host, port, "socket");
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 || listen(fd, 128) != 0) {
    absl::Status s = CannotListen(host, port, "bind");
    close(fd);
    return s;
  }
  socklen_t got = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &got);
  const int bound =
      ntohs(addr.ss_family == AF_INET ? reinterpret_cast<sockaddr_in*>(&addr)->sin_port
                                      : reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
  return std::unique_ptr<LinkServer>(new LinkServer(fd, bound, options));
}

LinkServer::~LinkServer() { close(fd_); }

bool LinkServer::IsLink(std::string_view identity) {
  return identity.size() == kIdentityBytes && identity.starts_with(kIdentityPrefix);
}

void LinkServer::AddPollItems(std::vector<zmq::pollitem_t>& items) const {
  items.push_back({nullptr, fd_, ZMQ_POLLIN, 0});
  for (const auto& [id, c] : links_) {
    const short events = ZMQ_POLLIN | (c.link->wants_write() ? ZMQ_POLLOUT : 0);
    items.push_back({nullptr, c.link->fd(), events, 0});
  }
}

bool LinkServer::has_unread() const {
  for (const auto& [id, c] : links_) {
    if (c.link->has_unread()) return true;
  }
  return false;
}

void LinkServer::Accept() {
  for (int i = 0; i < 64; ++i) {
    const int fd = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        LOG_EVERY_T(WARNING, 10) << "link accept: " << std::strerror(errno);
      }
      return;
    }
    if (links_.size() >= kMaxConnections) {
      LOG_EVERY_T(WARNING, 10) << "link: " << links_.size() << " connections already: one closed";
      close(fd);
      continue;
    }
    links_.emplace(Identity(next_id_++), Connection{std::make_unique<FrameLink>(fd, options_)});
  }
}

void LinkServer::Drop(const std::string& identity, std::vector<std::string>& closed) {
  auto it = links_.find(identity);
  if (it == links_.end()) return;
  if (it->second.greeted) closed.push_back(identity);
  links_.erase(it);
}

void LinkServer::Poll(std::vector<ReceivedMessage>& in, size_t max_messages,
                      std::vector<std::string>& closed) {
  Accept();
  std::vector<std::string> broken;
  std::vector<ReceivedMessage> got;
  for (auto& [id, c] : links_) {
    if (in.size() >= max_messages) break;
    got.clear();
    const absl::Status s = c.link->Read(got, max_messages - in.size());
    for (ReceivedMessage& m : got) {
      if (!c.greeted) {
        if (m.type != FrameLink::kHelloType || m.payload != FrameLink::kHelloPayload) {
          LOG_EVERY_T(WARNING, 10) << "link: a connection's first message was a " << m.type
                                   << ", not the link's hello: closed";
          broken.push_back(id);
          break;
        }
        c.greeted = true;
        continue;
      }
      m.prefix = id;
      in.push_back(std::move(m));
    }
    if (!s.ok()) {
      VLOG(1) << "link closed: " << s;
      broken.push_back(id);
    }
  }
  for (const std::string& id : broken) Drop(id, closed);
}

bool LinkServer::Subscribe(const std::string& identity) {
  auto it = links_.find(identity);
  if (it == links_.end()) return false;
  it->second.subscribed = true;
  return true;
}

void LinkServer::Broadcast(std::string_view type, std::string_view payload) {
  for (auto& [id, c] : links_) {
    if (c.subscribed && !c.link->broken()) c.link->Queue(type, payload).IgnoreError();
  }
}

LinkServer::Sent LinkServer::Queue(const std::string& identity, std::string_view type,
                                   std::string_view payload) {
  auto it = links_.find(identity);
  if (it == links_.end() || it->second.link->broken()) return Sent::kGone;
  const absl::Status s = it->second.link->Queue(type, payload);
  if (s.ok()) return Sent::kYes;
  if (absl::IsResourceExhausted(s)) return Sent::kFull;
  LOG_EVERY_T(WARNING, 10) << "link: a reply could not be queued: " << s;
  return Sent::kGone;
}

void LinkServer::Flush(std::vector<std::string>& closed) {
  std::vector<std::string> broken;
  for (auto& [id, c] : links_) {
    if (c.link->wants_write() && !c.link->Flush().ok()) broken.push_back(id);
  }
  for (const std::string& id : broken) Drop(id, closed);
}

}  // namespace kvserve::worker
