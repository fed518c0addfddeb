// A message stream over one TCP connection: the framed link between a router and a worker,
// which carries what a router's DEALER and a worker's ROUTER socket carry (requests, replies,
// control, KV transfer chunks) without ZeroMQ's mailbox, its I/O thread and its per-message
// system calls (docs/ROUTING.md, "What the worker link costs"). A message is
//   [u32, little-endian: the bytes that follow] [u8: the type's length] [type] [payload]
// with the same type names and payloads as common/net/zmq_framing.h's messages. The link's first
// message, from the side that connected, is kHelloType with kHelloPayload.
//
// Non-blocking: the owner waits for fd() in its own event loop (readable; writable while
// wants_write()), then calls Read and Flush. Queue only appends; Flush writes, so a turn's
// messages leave in one write. One thread owns a link.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<FrameLink> link, FrameLink::Connect("10.0.0.7", 5580, {}));
//   RETURN_IF_ERROR(link->Queue(request));   // kept until the connection is up
//   RETURN_IF_ERROR(link->Flush());
//   std::vector<ReceivedMessage> in;
//   if (absl::Status s = link->Read(in, 1024); !s.ok()) ...  // the link broke: `s` says why
#ifndef KVSERVE_COMMON_NET_FRAME_LINK_H_
#define KVSERVE_COMMON_NET_FRAME_LINK_H_

#include <sys/socket.h>

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/net/zmq_framing.h"
#include "google/protobuf/message.h"

namespace kvserve {

// A socket address from an IPv4 or IPv6 address (in brackets or not; "*" is 0.0.0.0) and a port.
// InvalidArgument, naming `host`, for anything else: names are not resolved here.
struct SocketAddress {
  sockaddr_storage addr{};
  socklen_t len = 0;
};
absl::StatusOr<SocketAddress> ParseSocketAddress(const std::string& host, int port);

class FrameLink {
 public:
  struct Options {
    // A message longer than this (its length field) breaks the link: a peer that sends one is
    // broken or hostile, and no buffer is grown for it.
    size_t max_message_bytes = size_t{256} << 20;
    // Queue refuses a message (ResourceExhausted) while this much waits unwritten: a peer
    // that stopped reading holds no more than this of the owner's memory.
    size_t max_queued_bytes = size_t{64} << 20;
  };

  static constexpr std::string_view kHelloType = "LinkHello";
  static constexpr std::string_view kHelloPayload = "kvserve-link/1";

  // Takes `fd`, a connected TCP socket (an accepted one), and makes it non-blocking.
  FrameLink(int fd, Options options);
  ~FrameLink();
  FrameLink(const FrameLink&) = delete;
  FrameLink& operator=(const FrameLink&) = delete;

  // Starts connecting to host:port (an IPv4 or IPv6 address, no name: the owner's thread must
  // not wait for a resolver) and queues the hello. InvalidArgument for a host that is not an
  // address; Unavailable when the connect fails at once.
  static absl::StatusOr<std::unique_ptr<FrameLink>> Connect(const std::string& host, int port,
                                                            Options options);

  // Appends a message to what Flush writes. ResourceExhausted (nothing queued) past
  // max_queued_bytes; FailedPrecondition on a broken link.
  absl::Status Queue(std::string_view type, std::string_view payload);
  absl::Status Queue(const google::protobuf::Message& message);
  // Writes what is queued, as far as the socket takes it. An error: the link broke (Unavailable
  // naming the cause); it stays broken.
  absl::Status Flush();
  // Reads what the socket holds and appends up to `max_messages` whole messages to `out`
  // (prefix empty). An error: the link broke (the peer closed it: Unavailable; a message over
  // max_message_bytes or a malformed one: DataLoss); messages before the break are appended
  // first. Messages past `max_messages` wait: has_unread() says so.
  absl::Status Read(std::vector<ReceivedMessage>& out, size_t max_messages);

  [[nodiscard]] int fd() const { return fd_; }
  // Bytes queued and not yet written (the connect not yet done counts as waiting).
  [[nodiscard]] size_t queued_bytes() const { return out_.size() - out_start_; }
  [[nodiscard]] bool wants_write() const { return connecting_ || queued_bytes() > 0; }
  // Whole messages read from the socket and not yet handed out by Read.
  [[nodiscard]] bool has_unread() const;
  [[nodiscard]] bool broken() const { return !broken_.ok(); }
  // The connection is up (Connect's, once a Flush saw it made) and not broken.
  [[nodiscard]] bool connected() const { return !connecting_ && broken_.ok(); }
  // Connect's connection is not made yet (or failed to be).
  [[nodiscard]] bool connecting() const { return connecting_; }

 private:
  // Breaks the link for good: later calls return `why`.
  absl::Status Break(absl::Status why);
  // Appends the whole messages in in_ to out (at most `max`); DataLoss on a bad length.
  absl::Status TakeMessages(std::vector<ReceivedMessage>& out, size_t max);
  // Checks a non-blocking connect: done, still going, or failed.
  absl::Status FinishConnect();
  // Room for a message header plus `payload` bytes; its start in out_.
  char* Append(std::string_view type, size_t payload_bytes);

  int fd_;
  Options options_;
  bool connecting_ = false;
  absl::Status broken_;
  std::string out_;  // queued bytes from out_start_
  size_t out_start_ = 0;
  std::string in_;  // read bytes in [in_start_, in_end_)
  size_t in_start_ = 0, in_end_ = 0;
};

}  // namespace kvserve

#endif  // KVSERVE_COMMON_NET_FRAME_LINK_H_
