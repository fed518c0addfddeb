#include "router/io_turns.h"

#include <algorithm>
#include <boost/asio/post.hpp>

namespace kvserve::router {

namespace asio = boost::asio;

IoTurns::IoTurns(asio::io_context& io, const std::vector<int>& fds, std::chrono::milliseconds idle,
                 std::function<bool()> turn)
    : io_(io), timer_(io), idle_(idle), turn_(std::move(turn)) {
  for (const int fd : fds) {
    watched_.push_back(std::make_unique<asio::posix::stream_descriptor>(io, fd));
  }
  watching_.assign(watched_.size(), false);
}

IoTurns::~IoTurns() { Stop(); }

void IoTurns::Start() {
  asio::post(io_, [this, live = live_] {
    if (!*live) return;
    WatchAll();
    timer_.expires_after(idle_);
    Tick();
    Soon();
  });
}

void IoTurns::Stop() {
  if (!*live_) return;
  *live_ = false;
  timer_.cancel();
  for (auto& d : watched_) d->release();  // the caller's: not closed
  watched_.clear();
}

bool IoTurns::OnThread() const { return io_.get_executor().running_in_this_thread(); }

// Asio re-arms a descriptor's edge-triggered registration for each wait (EPOLL_CTL_MOD), which
// reports it at once if it is readable then: so a descriptor is watched again only after the
// turn its wake-up brought took what it announced (watched before, it would wake again for the
// same signal), and a signal that came between that turn and the wait is not lost.
void IoTurns::WatchAll() {
  for (size_t i = 0; i < watched_.size(); ++i) {
    if (watching_[i]) continue;
    watching_[i] = true;
    watched_[i]->async_wait(asio::posix::descriptor_base::wait_read,
                            [this, i, live = live_](const boost::system::error_code& ec) {
                              if (!*live || ec) return;
                              watching_[i] = false;
                              Soon();
                            });
  }
}

// The periodic turn, at a fixed pace (re-arming the timer at every turn would cost a system call
// each).
void IoTurns::Tick() {
  timer_.async_wait([this, live = live_](const boost::system::error_code& ec) {
    if (!*live || ec) return;
    timer_.expires_at(std::max(timer_.expiry() + idle_, asio::steady_timer::clock_type::now()));
    Tick();
    Soon();
  });
}

void IoTurns::Soon() {
  if (scheduled_) return;
  scheduled_ = true;
  asio::post(io_, [this, live = live_] {
    if (!*live) return;
    scheduled_ = false;
    const bool again = turn_();
    WatchAll();
    if (again) Soon();
  });
}

}  // namespace kvserve::router
