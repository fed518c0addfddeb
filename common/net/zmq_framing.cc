#include "common/net/zmq_framing.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/string_util.h"

namespace kvserve {
namespace {

absl::Status FromZmqError(const zmq::error_t& e, std::string_view what) {
  std::string message = absl::StrCat(Sv(what), ": ", e.what());
  if (e.num() == EAGAIN) return absl::UnavailableError(message);
  if (e.num() == ETERM || e.num() == ENOTSOCK) return absl::CancelledError(message);
  // A ROUTER socket with ROUTER_MANDATORY: no peer has that routing id (it disconnected).
  if (e.num() == EHOSTUNREACH) return absl::NotFoundError(message);
  return absl::InternalError(message);
}

}  // namespace

absl::Status SendFrames(zmq::socket_t& socket, absl::Span<const std::string_view> frames,
                        zmq::send_flags flags) {
  try {
    for (size_t i = 0; i < frames.size(); ++i) {
      zmq::send_flags f = flags;
      if (i + 1 < frames.size()) f = f | zmq::send_flags::sndmore;
      zmq::message_t part(frames[i].data(), frames[i].size());
      if (!socket.send(part, f)) {
        // Only the first frame can hit EAGAIN: ZeroMQ queues the rest atomically.
        return absl::UnavailableError("zmq send would block");
      }
    }
  } catch (const zmq::error_t& e) {
    return FromZmqError(e, "zmq send");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<std::vector<std::string>>> ReceiveFrames(zmq::socket_t& socket,
                                                                      zmq::recv_flags flags) {
  std::vector<std::string> frames;
  try {
    zmq::message_t part;
    if (!socket.recv(part, flags)) return std::nullopt;
    frames.emplace_back(part.data<char>(), part.size());
    while (part.more()) {
      // The rest of a multipart message has already arrived; block for it.
      if (!socket.recv(part, zmq::recv_flags::none)) {
        return absl::InternalError("zmq recv: truncated multipart message");
      }
      frames.emplace_back(part.data<char>(), part.size());
    }
  } catch (const zmq::error_t& e) {
    return FromZmqError(e, "zmq recv");
  }
  return frames;
}

absl::Status SendMessage(zmq::socket_t& socket, std::string_view prefix,
                         const google::protobuf::Message& message, zmq::send_flags flags) {
  std::string payload;
  if (!message.SerializeToString(&payload)) {
    return absl::InternalError(absl::StrCat("cannot serialize ", message.GetTypeName()));
  }
  const std::string& type = message.GetDescriptor()->name();
  if (prefix.empty()) {
    std::string_view frames[] = {type, payload};
    return SendFrames(socket, frames, flags);
  }
  std::string_view frames[] = {prefix, type, payload};
  return SendFrames(socket, frames, flags);
}

absl::StatusOr<std::optional<ReceivedMessage>> ReceiveMessage(zmq::socket_t& socket,
                                                              bool with_prefix,
                                                              zmq::recv_flags flags) {
  absl::StatusOr<std::optional<std::vector<std::string>>> frames = ReceiveFrames(socket, flags);
  if (!frames.ok()) return frames.status();
  if (!frames->has_value()) return std::nullopt;
  std::vector<std::string>& f = **frames;
  const size_t expected = with_prefix ? 3 : 2;
  if (f.size() != expected) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed message: ", f.size(), " frames, expected ", expected));
  }
  ReceivedMessage m;
  size_t i = 0;
  if (with_prefix) m.prefix = std::move(f[i++]);
  m.type = std::move(f[i++]);
  m.payload = std::move(f[i]);
  return m;
}

absl::Status ParseMessage(const ReceivedMessage& message, google::protobuf::Message* out) {
  const std::string& want = out->GetDescriptor()->name();
  if (message.type != want) {
    return absl::InvalidArgumentError(absl::StrCat(
        "message type '", absl::CHexEscape(message.type.substr(0, 64)), "' is not ", want));
  }
  if (!out->ParseFromString(message.payload)) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed ", want, " payload (", message.payload.size(), " bytes)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int> BindTcp(zmq::socket_t& socket, const std::string& host, int port,
                            std::string_view flag) {
  const std::string ep =
      absl::StrCat("tcp://", host, ":", port == 0 ? std::string("*") : std::to_string(port));
  try {
    socket.bind(ep);
    const std::string last = socket.get(zmq::sockopt::last_endpoint);
    return std::stoi(last.substr(last.rfind(':') + 1));
  } catch (const zmq::error_t& e) {
    return absl::UnavailableError(
        absl::StrCat(Sv(flag), " ", port, ": cannot bind ", ep, ": ", e.what()));
  }
}

}  // namespace kvserve
