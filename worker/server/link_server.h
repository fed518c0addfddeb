// The worker's framed-link port (--link-port): routers started with --worker-link=tcp connect
// here and send what they would send its ROUTER socket (common/net/frame_link.h), and the
// replies go back on the same connection. Each connection is a router peer with an identity of
// its own, which no ZeroMQ peer can have (ZeroMQ's generated routing ids are 5 bytes from a zero
// byte, and a peer may not choose one that starts with zero), so the worker keeps one table of
// routes for both kinds of peer.
//
// A connection's first message must be the link's hello; one that sends anything else, breaks
// the framing or closes is dropped and named by Poll, so that its requests are aborted. A
// connection that subscribes (LinkSubscribe) also gets what the PUB port publishes.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<LinkServer> links, LinkServer::Listen("0.0.0.0", 5580));
//   links->AddPollItems(items);  zmq::poll(items, ...);
//   links->Poll(messages, 256, closed);  // messages' prefix: the connection's identity
//   links->Queue(identity, "GenerateResponse", payload);  links->Flush(closed);
//
// One thread (the worker's loop) owns it.
#ifndef KVSERVE_WORKER_SERVER_LINK_SERVER_H_
#define KVSERVE_WORKER_SERVER_LINK_SERVER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/net/frame_link.h"
#include "common/net/zmq_framing.h"
#include "zmq.hpp"

namespace kvserve::worker {

class LinkServer {
 public:
  // Listens on host:port (0: any free port). Unavailable, naming --link-port, when it cannot.
  static absl::StatusOr<std::unique_ptr<LinkServer>> Listen(const std::string& host, int port,
                                                            FrameLink::Options options = {});
  ~LinkServer();
  LinkServer(const LinkServer&) = delete;
  LinkServer& operator=(const LinkServer&) = delete;

  // Whether `identity` names one of a LinkServer's connections (not a ZeroMQ peer).
  static bool IsLink(std::string_view identity);

  [[nodiscard]] int port() const { return port_; }
  [[nodiscard]] size_t connections() const { return links_.size(); }

  // Appends what to wait for: the listener, each connection (writable too while it has bytes
  // queued, or whole messages already read).
  void AddPollItems(std::vector<zmq::pollitem_t>& items) const;
  // Whether a connection holds messages already read that no descriptor will signal.
  [[nodiscard]] bool has_unread() const;
  // Accepts new connections, reads up to `max_messages` messages (prefix: the connection's
  // identity; hellos are not handed out) and appends the identities of connections that closed
  // or broke to `closed`.
  void Poll(std::vector<ReceivedMessage>& in, size_t max_messages,
            std::vector<std::string>& closed);

  // The connection asked for what the PUB port publishes (LinkSubscribe): Broadcast sends it
  // there too. False when there is no such connection.
  bool Subscribe(const std::string& identity);
  // Queues a published message to every subscribed connection; one whose queue is full misses
  // it (as a slow PUB subscriber does: a KV batch missed is a gap its router resyncs from).
  void Broadcast(std::string_view type, std::string_view payload);

  enum class Sent { kYes, kFull, kGone };
  // Queues a message to a connection (written by Flush): kFull while too much waits for it,
  // kGone when there is no such connection.
  Sent Queue(const std::string& identity, std::string_view type, std::string_view payload);
  // Writes what every connection has queued; appends those that broke to `closed`.
  void Flush(std::vector<std::string>& closed);

 private:
  struct Connection {
    std::unique_ptr<FrameLink> link;
    bool greeted = false;     // its hello came
    bool subscribed = false;  // it gets what the PUB port publishes
  };
  LinkServer(int fd, int port, FrameLink::Options options)
      : fd_(fd), port_(port), options_(options) {}
  void Accept();
  // Drops a connection, naming it in `closed` if it had greeted (only then can it have
  // requests).
  void Drop(const std::string& identity, std::vector<std::string>& closed);

  int fd_;
  int port_;
  FrameLink::Options options_;
  uint64_t next_id_ = 1;
  absl::flat_hash_map<std::string, Connection> links_;
};

}  // namespace kvserve::worker

#endif  // KVSERVE_WORKER_SERVER_LINK_SERVER_H_
