// Runs a loop's turns on a Boost.Asio io_context instead of a thread of its own, so that one
// thread serves the loop and whatever else the io_context runs (kvserve-router --api-threads 0:
// the HTTP front's sockets and handlers, and the routing core). A turn runs when one of the
// watched descriptors becomes readable, when the last turn asked for another at once, and at
// least every `idle` (the loop's periodic work). Turns never overlap: one runs at a time, on the
// io_context's thread, and several wake-ups before it runs make one turn. A descriptor costs a
// system call (epoll_ctl) per wake-up.
//
//   IoTurns turns(io, {pool.wait_fd(), inbox.fd()}, 25ms, [&] { return core.Turn(); });
//   turns.Start();   // any thread
//   ...              // io.run() on one thread
//   turns.Stop();    // on the io_context's thread, or once it no longer runs
//
// The descriptors stay the caller's: they are watched, never read or closed, and must stay open
// until Stop. Each is watched edge-triggered (Asio's epoll), so a turn must take everything a
// wake-up announced, or ask for another turn at once.
#ifndef KVSERVE_ROUTER_IO_TURNS_H_
#define KVSERVE_ROUTER_IO_TURNS_H_

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <vector>

namespace kvserve::router {

class IoTurns {
 public:
  // `turn` returns true when another turn should follow at once.
  IoTurns(boost::asio::io_context& io, const std::vector<int>& fds, std::chrono::milliseconds idle,
          std::function<bool()> turn);
  ~IoTurns();
  IoTurns(const IoTurns&) = delete;
  IoTurns& operator=(const IoTurns&) = delete;

  // Starts watching and runs a first turn soon. Any thread.
  void Start();
  // No turn runs after it returns; the descriptors are released (left open). Idempotent. On the
  // io_context's thread, or once no thread runs it.
  void Stop();
  // Whether the caller runs on the io_context's thread. Any thread.
  [[nodiscard]] bool OnThread() const;
  // A turn soon, without a descriptor's wake-up (coalesced with any other). On that thread.
  void Soon();

 private:
  // The io_context's thread owns everything below.
  void WatchAll();
  void Tick();

  boost::asio::io_context& io_;
  std::vector<std::unique_ptr<boost::asio::posix::stream_descriptor>> watched_;
  std::vector<bool> watching_;  // a wait is under way
  boost::asio::steady_timer timer_;
  std::chrono::milliseconds idle_;
  std::function<bool()> turn_;
  bool scheduled_ = false;
  // Cleared by Stop: a wake-up still queued then (an aborted wait, a posted turn) does nothing.
  std::shared_ptr<bool> live_ = std::make_shared<bool>(true);
};

}  // namespace kvserve::router

#endif  // KVSERVE_ROUTER_IO_TURNS_H_
