#include "worker/server/publisher.h"

#include "common/net/zmq_framing.h"

namespace kvserve::worker {

absl::Status Publisher::Publish(std::string_view topic, const google::protobuf::Message& m) {
  payload_.clear();
  if (!m.SerializeToString(&payload_)) {
    return absl::InternalError(std::string("cannot serialize ") + m.GetTypeName());
  }
  const std::string_view type = m.GetDescriptor()->name();
  if (links_ != nullptr) links_->Broadcast(type, payload_);
  const std::string_view frames[] = {topic, type, payload_};
  return SendFrames(*pub_, frames, zmq::send_flags::dontwait);
}

}  // namespace kvserve::worker
