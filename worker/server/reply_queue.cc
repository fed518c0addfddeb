#include "worker/server/reply_queue.h"

#include <string_view>

#include "common/net/zmq_framing.h"
#include "glog/logging.h"

namespace kvserve::worker {

ReplyQueue::Sent ReplyQueue::TrySend(const std::string& identity, const Pending& p) {
  if (links_ != nullptr && LinkServer::IsLink(identity)) {
    switch (links_->Queue(identity, p.type, p.payload)) {
      case LinkServer::Sent::kYes:
        return Sent::kYes;
      case LinkServer::Sent::kFull:
        return Sent::kFull;
      case LinkServer::Sent::kGone:
        return Sent::kGone;
    }
  }
  const std::string_view frames[] = {identity, p.type, p.payload};
  const absl::Status s = SendFrames(*socket_, frames, zmq::send_flags::dontwait);
  if (s.ok()) return Sent::kYes;
  if (absl::IsUnavailable(s)) return Sent::kFull;
  VLOG(1) << "reply to a gone peer: " << s;
  return Sent::kGone;
}

void ReplyQueue::Send(const std::string& identity, const google::protobuf::Message& m) {
  Pending p{std::string(m.GetDescriptor()->name()), "", Clock::now()};
  if (!m.SerializeToString(&p.payload)) {
    LOG(ERROR) << "cannot serialize " << m.GetTypeName();
    ++dropped_;
    return;
  }
  auto it = queues_.find(identity);
  if (it == queues_.end()) {
    switch (TrySend(identity, p)) {
      case Sent::kYes:
        return;
      case Sent::kGone:
        ++dropped_;
        given_up_.push_back(identity);
        return;
      case Sent::kFull:
        it = queues_.try_emplace(identity).first;
        break;
    }
  }
  it->second.push_back(std::move(p));
  ++waiting_;
  ++waited_;
}

void ReplyQueue::GiveUp(const std::string& identity) {
  auto it = queues_.find(identity);
  if (it == queues_.end()) return;
  dropped_ += static_cast<int64_t>(it->second.size());
  waiting_ -= it->second.size();
  queues_.erase(it);
  given_up_.push_back(identity);
}

std::vector<std::string> ReplyQueue::Flush(Clock::time_point now) {
  std::vector<std::string> stuck;
  for (auto& [identity, queue] : queues_) {
    Sent sent = Sent::kYes;
    while (!queue.empty() && (sent = TrySend(identity, queue.front())) == Sent::kYes) {
      queue.pop_front();
      --waiting_;
    }
    if (sent == Sent::kGone || (!queue.empty() && now - queue.front().since >= give_up_)) {
      stuck.push_back(identity);
    }
  }
  for (const std::string& identity : stuck) {
    LOG(WARNING) << "replies to a router peer dropped: it is gone or has not read for "
                 << std::chrono::duration_cast<std::chrono::seconds>(give_up_).count() << " s";
    GiveUp(identity);
  }
  absl::erase_if(queues_, [](const auto& entry) { return entry.second.empty(); });
  return std::exchange(given_up_, {});
}

}  // namespace kvserve::worker
