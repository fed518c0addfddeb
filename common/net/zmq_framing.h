// ZeroMQ + protobuf framing used between the router and the workers. A message travels as
//   [prefix] [type] [payload]
// where `prefix` is the routing id on a ROUTER socket or the topic on PUB/SUB (omitted on a
// DEALER), `type` is the protobuf message's name (e.g. "GenerateRequest") and `payload` its
// serialization. cppzmq throws zmq::error_t; every function here converts that to a Status.
//
//   RETURN_IF_ERROR(SendMessage(dealer, /*prefix=*/"", request));
//   ASSIGN_OR_RETURN(std::optional<ReceivedMessage> m, ReceiveMessage(router,
//   /*with_prefix=*/true)); if (m && m->type == "GenerateRequest") RETURN_IF_ERROR(ParseMessage(*m,
//   &request));
//
// A socket is used only by the thread that made it (ZeroMQ sockets are not thread-safe).
#ifndef KVSERVE_COMMON_NET_ZMQ_FRAMING_H_
#define KVSERVE_COMMON_NET_ZMQ_FRAMING_H_

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "google/protobuf/message.h"
#include "zmq.hpp"

namespace kvserve {

struct ReceivedMessage {
  std::string prefix;  // routing id or topic; empty when received without one
  std::string type;
  std::string payload;
};

// Sends `frames` as one multipart message. Unavailable if the socket cannot send now with
// `flags` = dontwait (EAGAIN), NotFound if a ROUTER_MANDATORY socket has no peer of that
// routing id (EHOSTUNREACH), Internal for other ZeroMQ errors.
absl::Status SendFrames(zmq::socket_t& socket, absl::Span<const std::string_view> frames,
                        zmq::send_flags flags = zmq::send_flags::none);

// Receives one whole multipart message; nullopt when `flags` is dontwait and nothing is
// waiting (or the socket's receive timeout passed).
absl::StatusOr<std::optional<std::vector<std::string>>> ReceiveFrames(
    zmq::socket_t& socket, zmq::recv_flags flags = zmq::recv_flags::none);

// Sends [prefix] [type name] [payload]; an empty `prefix` is omitted (DEALER side).
absl::Status SendMessage(zmq::socket_t& socket, std::string_view prefix,
                         const google::protobuf::Message& message,
                         zmq::send_flags flags = zmq::send_flags::none);

// Receives one message. InvalidArgument (the frames are consumed) if it does not have the
// expected number of frames; the caller drops and counts it.
absl::StatusOr<std::optional<ReceivedMessage>> ReceiveMessage(
    zmq::socket_t& socket, bool with_prefix, zmq::recv_flags flags = zmq::recv_flags::none);

// Parses the payload into `out`. InvalidArgument if the type name differs from out's or the
// payload does not parse.
absl::Status ParseMessage(const ReceivedMessage& message, google::protobuf::Message* out);

// Binds `socket` to tcp://host:port (port 0: any free port) and returns the port bound;
// Unavailable naming `flag` and the endpoint when it cannot bind.
absl::StatusOr<int> BindTcp(zmq::socket_t& socket, const std::string& host, int port,
                            std::string_view flag);

}  // namespace kvserve

#endif  // KVSERVE_COMMON_NET_ZMQ_FRAMING_H_
