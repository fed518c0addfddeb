#include "proto/worker_control.h"

#include <string>

namespace kvserve {

namespace pb = ::kvserve::v1;

pb::ControlReply AnswerControl(
    const pb::Control& c,
    std::initializer_list<std::pair<pb::ControlAction, ControlHandler>> handlers,
    const std::function<absl::Status(pb::ControlAction)>& unserved) {
  absl::Status s = absl::OkStatus();
  bool served = false;
  for (const auto& [action, handler] : handlers) {
    if (action != c.action()) continue;
    s = handler(c);
    served = true;
    break;
  }
  if (!served) s = unserved(c.action());
  pb::ControlReply r;
  r.set_control_id(c.control_id());
  r.set_ok(s.ok());
  if (!s.ok()) {
    r.mutable_error()->set_code(static_cast<int>(s.code()));
    r.mutable_error()->set_message(std::string(s.message()));
  }
  return r;
}

}  // namespace kvserve
