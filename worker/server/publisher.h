// What a worker publishes (KV events, statuses, recycle asks): on its PUB socket under a topic,
// and to every framed-link connection that subscribed (link_server.h), serialized once.
//
//   Publisher publisher(pub_socket, link_server);  // link_server may be null
//   RETURN_IF_ERROR(publisher.Publish("kv", batch));
//
// One thread (the worker's loop) owns it, the socket and the link server.
#ifndef KVSERVE_WORKER_SERVER_PUBLISHER_H_
#define KVSERVE_WORKER_SERVER_PUBLISHER_H_

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "google/protobuf/message.h"
#include "worker/server/link_server.h"
#include "zmq.hpp"

namespace kvserve::worker {

class Publisher {
 public:
  Publisher(zmq::socket_t* pub, LinkServer* links) : pub_(pub), links_(links) {}

  // The PUB socket's error when it refuses the message now (its subscribers' queues are full);
  // the links are sent to either way.
  absl::Status Publish(std::string_view topic, const google::protobuf::Message& m);

 private:
  zmq::socket_t* pub_;
  LinkServer* links_;
  std::string payload_;  // reused
};

}  // namespace kvserve::worker

#endif  // KVSERVE_WORKER_SERVER_PUBLISHER_H_
