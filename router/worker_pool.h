// The router's connections to its workers: per worker a DEALER to its ROUTER port (requests,
// responses) and a SUB to its PUB port (KV events, snapshots, heartbeats, recycle asks). Events
// feed the PrefixIndex; a gap triggers a snapshot request; heartbeats give each worker's
// state, load and cache key; a worker whose heartbeat stops is unhealthy.
//
//   WorkerPool pool(ctx, &index, absl::Seconds(2));
//   int w = pool.Add({"w0", "127.0.0.1", 5570, 5571});
//   for (auto& [worker, message] : pool.Poll(10)) ...   // responses and control replies
//   RETURN_IF_ERROR(pool.Send(w, request));
//
// One thread (the router's core loop) owns the pool and all its sockets. A loop that waits in an
// event loop of its own (RouterCore::StartOn) waits for wait_fd() and calls Poll(0).
#ifndef KVSERVE_ROUTER_WORKER_POOL_H_
#define KVSERVE_ROUTER_WORKER_POOL_H_

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/net/curve.h"
#include "common/net/frame_link.h"
#include "common/net/zmq_framing.h"
#include "kvserve/v1/kvserve.pb.h"
#include "router/routing/prefix_index.h"
#include "router/routing/routing_policy.h"
#include "router/routing/snapshot_build.h"
#include "zmq.hpp"

namespace kvserve::router {

struct WorkerEndpoint {
  std::string name;
  std::string host;
  int port = 0;
  int events_port = 0;
};

class WorkerPool {
 public:
  struct Counters {
    int64_t event_batches = 0;
    int64_t gaps = 0;   // a stream that was whole skipped a batch
    int64_t joins = 0;  // the first batch heard was not the stream's first (router start)
    int64_t snapshots = 0;
    int64_t recycle_asks = 0;
    int64_t dropped = 0;           // messages malformed or with impossible values, dropped
    int64_t reconnects = 0;        // sockets made anew after a silence (worker_pool.cc)
    int64_t connect_failures = 0;  // sockets that could not be made (out of sockets or files)
    int64_t links_lost = 0;        // framed links that broke (UseLinks)
    double last_event_lag_s = 0;   // receive time − the batch's timestamp, last batch
  };

  // With `curve`, every socket to a worker is a CURVE client (common/net/curve.h). Raises
  // `ctx`'s socket limit to ZeroMQ's most (a pool holds two sockets a worker; the default 1,023
  // stopped a router at ~510 workers; it takes effect only if `ctx` has made no socket yet). A
  // worker whose sockets cannot be made (the open-file limit) stays unconnected and is tried
  // again.
  WorkerPool(zmq::context_t& ctx, PrefixIndex* index, absl::Duration heartbeat_timeout,
             std::optional<CurveClientKeys> curve = std::nullopt);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Connects to a worker; returns its index (stable until Remove).
  int Add(const WorkerEndpoint& endpoint);
  void Remove(int w);

  // Waits up to timeout_ms for traffic (or for `wake_fd`, a file descriptor that becomes
  // readable when the caller has other work, the same one every call; -1: none; it must stay
  // open while the pool lives), handles events / snapshots /
  // heartbeats, and returns the messages that answer requests (GenerateResponse, ControlReply,
  // and the KV transfer's KvChunk and KvChunkAck) with their worker.
  std::vector<std::pair<int, ReceivedMessage>> Poll(int timeout_ms, int wake_fd = -1);
  absl::Status Send(int w, const google::protobuf::Message& message);
  // An epoll set of every socket's ZMQ_FD: readable when one of them may have a message, for a
  // caller that waits in its own event loop (its sockets change with Add, Remove and
  // reconnects; this descriptor does not). Poll(0) then takes what came.
  [[nodiscard]] int wait_fd() const { return wait_fd_; }
  // Whether a socket may hold messages its descriptor will not signal (after a send, or a
  // drain cut short): the caller must Poll again without waiting for wait_fd().
  [[nodiscard]] bool unread() const;
  // Sends a message another worker sent, as it came (the KV transfer's relayed chunks).
  absl::Status Forward(int w, const ReceivedMessage& m);
  // A message from worker w's PUB socket, as Poll hands it on (public for the fuzzer): one that
  // is malformed or impossible is counted in counters().dropped and ignored.
  void HandleSub(int w, const ReceivedMessage& m);

  // Framed TCP links (common/net/frame_link.h, kvserve-router --worker-link=tcp): a worker whose
  // heartbeat offers WorkerStatus.link_port is connected to it too, and once that connection is
  // up, Send and Forward go on it instead of the DEALER (and the worker answers on it). Not with
  // CURVE keys (the link has no authentication yet). The pool also asks the worker for its
  // published stream on the link (LinkSubscribe) and leaves the SUB socket's topics once the
  // link carries it. A link that breaks is made again at a later heartbeat; meanwhile the
  // DEALER and SUB carry the messages (a KV batch missed between them is a gap: a snapshot).
  void UseLinks() { use_links_ = true; }
  // The link a message to worker `w` goes on now: its number (1, 2, ... per worker, a new one
  // per connection); 0: the DEALER.
  [[nodiscard]] int link_epoch(int w) const;
  // Links that broke since the last call, (worker, link number): the worker aborts what was sent
  // on one, so those requests are lost.
  std::vector<std::pair<int, int>> TakeLostLinks() { return std::exchange(lost_links_, {}); }
  // Whether worker `w`'s published stream comes on its link (its SUB socket has no topic).
  [[nodiscard]] bool link_subscribed(int w) const {
    return w >= 0 && w < size() && workers_[w].link_subscribed;
  }

  // Routing views: eligible = heartbeat within the timeout and READY.
  [[nodiscard]] std::vector<WorkerView> Views() const;
  // The latest heartbeat, if any.
  [[nodiscard]] const kvserve::v1::WorkerStatus* status(int w) const;
  // Its latest load report (WorkerStatus.load_report), if it is in the pool and sends them.
  [[nodiscard]] const kvserve::v1::LoadReport* load_report(int w) const;
  // When its latest heartbeat (and load report) arrived (the epoch when none has).
  [[nodiscard]] std::chrono::steady_clock::time_point heard_at(int w) const {
    return w >= 0 && w < size() ? workers_[w].last_heartbeat
                                : std::chrono::steady_clock::time_point();
  }
  // Workers added so far: indices 0 .. size() - 1, removed ones among them.
  [[nodiscard]] int size() const { return static_cast<int>(workers_.size()); }
  // The block-hash extra key the worker uses, from its heartbeat (common/kv/BLOCK_HASH.md).
  [[nodiscard]] absl::StatusOr<std::string> ExtraKey(int w, std::string_view cache_salt) const;
  // Recycle asks seen since the last call: (worker, instance, reason).
  std::vector<std::tuple<int, uint64_t, std::string>> TakeRecycleAsks();
  [[nodiscard]] const Counters& counters() const { return counters_; }
  // The same counts for one worker (since the router started; they survive its restarts).
  [[nodiscard]] Counters counters(int w) const;

 private:
  // One of a worker's sockets, with the descriptor ZeroMQ signals it on (ZMQ_FD). The descriptor
  // is readable when the socket's state may have changed; a send, or a drain cut short, can
  // leave messages it does not signal: `unread` says to drain the socket without waiting.
  struct Socket {
    std::unique_ptr<zmq::socket_t> socket;
    int fd = -1;
    bool unread = true;
  };
  struct Worker {
    WorkerEndpoint endpoint;
    Socket dealer, sub;
    std::optional<kvserve::v1::WorkerStatus> status;
    std::chrono::steady_clock::time_point last_heartbeat, connected;
    bool active = true;
    Counters counters;
    std::chrono::steady_clock::time_point snapshot_asked;  // the last snapshot request
    int silent_reconnects = 0;  // since its last heartbeat (ReconnectSilent)
    // The framed link (UseLinks; null: none), its number, the worker process it was made to, the
    // breaks in a row since one carried a message, and when the next may be tried.
    std::unique_ptr<FrameLink> link;
    int link_epoch = 0;
    uint64_t link_instance = 0;
    int link_failures = 0;
    std::chrono::steady_clock::time_point link_retry;
    bool link_out = false;         // its descriptor is watched for writing too
    bool link_subscribed = false;  // the link carries the published stream; SUB has no topic
    // Its routing view as of its last heartbeat (RefreshView), less fresh and eligible, which
    // Views() sets from the clock: built per heartbeat, not per turn (it was 155 us a turn at
    // 1,024 workers, worker_views_bench).
    WorkerView view;
  };
  void RefreshView(int w);
  // A snapshot not come within this is asked for again (a request lost on its way).
  static constexpr std::chrono::seconds kSnapshotRetry{2};
  void AskSnapshot(Worker& worker, int w);
  // (Re)makes the worker's sockets and connects them.
  void Connect(int w);
  // Adds a socket's descriptor to wait_fd_'s set, or takes it out (before the socket closes:
  // ZeroMQ may close its descriptor later, on its own thread).
  void Watch(const Socket& s, int w, bool is_sub) const;
  void Unwatch(const Socket& s) const;
  // The framed link's part (worker_pool_links.cc): connects one when the worker's heartbeat
  // offers it; reads and writes it when its descriptor signals; sends on it; drops a broken one.
  void MaybeLink(int w);
  void ServeLink(int w, std::vector<std::pair<int, ReceivedMessage>>& out);
  absl::Status SendOnLink(int w, absl::FunctionRef<absl::Status(FrameLink&)> queue);
  void LoseLink(int w, const absl::Status& why);
  // Watches the link's descriptor for writing while it has bytes waiting, not otherwise.
  void ArmLink(int w);
  // The SUB socket's topics, all on or all off.
  void Subscribe(Socket& sub, bool on) const;
  // ZeroMQ gives up on a connection whose handshake failed (a worker that did not yet list this
  // router's key) and never tries again: a worker silent for max(5 s, 2 heartbeat timeouts)
  // gets new sockets, then after twice, four and eight times that while it stays silent (the
  // last again and again), and after that again once it has been heard.
  void ReconnectSilent();
  // Unavailable: worker w has no sockets (Connect failed; it is tried again).
  absl::Status NotConnected(int w) const;
  // Makes `socket` a CURVE client when the pool has keys.
  void Secure(zmq::socket_t& socket) const;
  absl::Status ApplySub(Worker& worker, int w, const ReceivedMessage& m);
  // Counts a message ApplySub (or a snapshot's build) could not use as dropped.
  void CountIfDropped(Worker& worker, int w, const absl::Status& s);
  absl::Status InstallSnapshot(Worker& worker, int w, BuiltSnapshot built);
  // Receives what `s` holds (up to a cap; `unread` stays set if more is left): a PUB socket's
  // messages go to pending_sub_, a DEALER's answers are appended to `out`.
  void Drain(int w, bool is_sub, std::vector<std::pair<int, ReceivedMessage>>& out);
  // A published message (from the SUB socket or a subscribed link) into pending_sub_.
  void QueueSub(int w, ReceivedMessage m);
  // Handles pending_sub_ in the order received, its snapshots built on several threads first
  // (a restarted router's rebuild: routing/snapshot_build.h).
  void FlushSub();

  zmq::context_t& ctx_;
  // An epoll set: wait_fd(); an event's data is (worker << 2) | its kind.
  const int wait_fd_;
  enum Kind : uint64_t { kDealer = 0, kSub = 1, kLink = 2 };
  // Sockets Poll takes from wait_fd_ a turn; more_ready_: a turn found that many (more wait).
  static constexpr int kMaxReadyPerTurn = 256;
  bool more_ready_ = false;
  // The descriptor a waiting Poll also wakes on (its wake_fd), in wait_fd_'s set under kWakeTag
  // from the first Poll that waits with it; -1: none. A Poll(0) caller that waits in its own
  // event loop (RouterCore::StartOn) never adds one, so wait_fd() signals only for sockets.
  static constexpr uint64_t kWakeTag = ~uint64_t{0};
  int wake_fd_ = -1;
  void WatchWakeFd(int fd);
  PrefixIndex* index_;
  absl::Duration heartbeat_timeout_;
  std::optional<CurveClientKeys> curve_;
  bool use_links_ = false;
  std::vector<std::pair<int, int>> lost_links_;
  std::vector<Worker> workers_;
  std::vector<std::tuple<int, uint64_t, std::string>> recycle_asks_;
  Counters counters_;
  std::vector<char> event_arena_block_ = std::vector<char>(256 << 10);  // see ApplySub
  // PUB-socket messages drained this turn, not yet handled; how many are snapshots. At most
  // kMaxPendingSnapshots snapshots are held (each up to a few MB) before they are handled.
  std::vector<std::pair<int, ReceivedMessage>> pending_sub_;
  int pending_snapshots_ = 0;
  static constexpr int kMaxPendingSnapshots = 32;
  const int snapshot_threads_ = SnapshotThreads();
};

}  // namespace kvserve::router

#endif  // KVSERVE_ROUTER_WORKER_POOL_H_
