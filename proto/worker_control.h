// A worker's answer to a Control message on its ROUTER port, shared by every process that plays
// a worker (kvserve-worker's WorkerServer, kvserve-upstream's bridge): one handler per action it
// serves, each returning OK or why it refuses; any other action is refused with what
// `unserved` returns. The reply carries the control's id, ok, and the refusal's code and
// message.
//
//   Reply(identity, AnswerControl(c, {{pb::CONTROL_ACTION_DRAIN, drain},
//                                     {pb::CONTROL_ACTION_UNDRAIN, undrain}}, unserved));
//
// Calls the handlers on the caller's thread, once each at most.
#ifndef KVSERVE_PROTO_WORKER_CONTROL_H_
#define KVSERVE_PROTO_WORKER_CONTROL_H_

#include <functional>
#include <initializer_list>
#include <utility>

#include "absl/status/status.h"
#include "kvserve/v1/kvserve.pb.h"

namespace kvserve {

using ControlHandler = std::function<absl::Status(const kvserve::v1::Control&)>;

kvserve::v1::ControlReply AnswerControl(
    const kvserve::v1::Control& c,
    std::initializer_list<std::pair<kvserve::v1::ControlAction, ControlHandler>> handlers,
    const std::function<absl::Status(kvserve::v1::ControlAction)>& unserved);

}  // namespace kvserve

#endif  // KVSERVE_PROTO_WORKER_CONTROL_H_
