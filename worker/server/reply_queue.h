// The worker's replies on its ROUTER socket, delivered in order per peer and never dropped
// while the peer is there. The socket must have ROUTER_MANDATORY set: a reply to a peer whose
// send queue is full (its high-water mark) waits here instead of vanishing, and later replies
// to that peer wait behind it. A peer that is gone (no such routing id), or whose oldest
// waiting reply has waited `give_up`, is given up: its replies are dropped and Flush names it,
// so that the caller can abort its requests.
//
//   ReplyQueue replies(router_socket, link_server, std::chrono::seconds(30));
//   replies.Send(identity, response);           // now, or queued
//   for (const std::string& peer : replies.Flush(Clock::now())) AbortRequestsOf(peer);
//
// Replies to a peer of the framed link (link_server.h) are queued on its connection instead, and
// a connection that closed is a gone peer.
//
// One thread (the worker's loop) owns it, the socket and the link server.
#ifndef KVSERVE_WORKER_SERVER_REPLY_QUEUE_H_
#define KVSERVE_WORKER_SERVER_REPLY_QUEUE_H_

#include <chrono>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "google/protobuf/message.h"
#include "worker/server/link_server.h"
#include "zmq.hpp"

namespace kvserve::worker {

class ReplyQueue {
 public:
  using Clock = std::chrono::steady_clock;

  // `links` may be null (no --link-port).
  ReplyQueue(zmq::socket_t* socket, LinkServer* links, Clock::duration give_up)
      : socket_(socket), links_(links), give_up_(give_up) {}

  // Sends `m` to `identity` now, or queues it behind that peer's waiting replies.
  void Send(const std::string& identity, const google::protobuf::Message& m);
  // Sends what waits, in order, as far as each peer takes it. Returns the peers given up on
  // since the last call (gone, or stuck past give_up), whose replies were dropped.
  std::vector<std::string> Flush(Clock::time_point now);

  // Replies waiting now; replies that had to wait; replies dropped because their peer was gone
  // or stuck (all since start).
  [[nodiscard]] size_t waiting() const { return waiting_; }
  [[nodiscard]] int64_t waited() const { return waited_; }
  [[nodiscard]] int64_t dropped() const { return dropped_; }

 private:
  struct Pending {
    std::string type, payload;
    Clock::time_point since;
  };
  enum class Sent { kYes, kFull, kGone };
  Sent TrySend(const std::string& identity, const Pending& p);
  void GiveUp(const std::string& identity);

  zmq::socket_t* socket_;
  LinkServer* links_;
  Clock::duration give_up_;
  absl::flat_hash_map<std::string, std::deque<Pending>> queues_;
  std::vector<std::string> given_up_;
  size_t waiting_ = 0;
  int64_t waited_ = 0, dropped_ = 0;
};

}  // namespace kvserve::worker

#endif  // KVSERVE_WORKER_SERVER_REPLY_QUEUE_H_
