#include "upstream/vllm_event_source.h"

#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/kv/vllm_kv_events.h"
#include "common/net/zmq_framing.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace kvserve::upstream {

VllmEventSource::VllmEventSource(zmq::context_t& ctx, int rank)
    : rank_(rank), sub_(ctx, zmq::socket_type::sub), replay_(ctx, zmq::socket_type::dealer) {}

absl::StatusOr<std::unique_ptr<VllmEventSource>> VllmEventSource::Open(zmq::context_t& ctx,
                                                                       const VllmEventEndpoints& e,
                                                                       const std::string& topic,
                                                                       int rank) {
  std::unique_ptr<VllmEventSource> s(new VllmEventSource(ctx, rank));
  const std::string* at = &e.events;
  try {
    s->sub_.set(zmq::sockopt::linger, 0);
    s->sub_.set(zmq::sockopt::subscribe, topic);
    if (e.bind) {
      s->sub_.bind(e.events);
    } else {
      s->sub_.connect(e.events);
    }
    s->replay_.set(zmq::sockopt::linger, 0);
    if (!e.replay.empty()) {
      at = &e.replay;
      s->replay_.connect(e.replay);
      s->has_replay_ = true;
    }
  } catch (const zmq::error_t& err) {
    return absl::InvalidArgumentError(
        absl::StrCat("the upstream's event endpoint ", *at, " (rank ", rank, "): ", err.what()));
  }
  return s;
}

void VllmEventSource::AddPollItems(std::vector<zmq::pollitem_t>& items) {
  items.push_back({sub_.handle(), 0, ZMQ_POLLIN, 0});
  if (has_replay_) items.push_back({replay_.handle(), 0, ZMQ_POLLIN, 0});
}

void VllmEventSource::Read(const Callbacks& cb, UpstreamMetrics& metrics) {
  ReadLive(cb, metrics);
  ReadReplay(cb, metrics);
}

void VllmEventSource::TakeHeld(const Callbacks& cb, UpstreamMetrics& metrics) {
  std::map<uint64_t, std::string> held;
  held.swap(held_);
  for (const auto& [seq, payload] : held) {
    if (seq < next_seq_) continue;  // the replay brought it
    if (seq > next_seq_) {          // one is missing: the replay from there brings the rest
      metrics.gaps->Increment();
      AskReplay(next_seq_, metrics);
      if (replaying_) return;
    }
    next_seq_ = seq + 1;
    cb.batch(seq, payload);
  }
}

void VllmEventSource::AskReplay(uint64_t from, UpstreamMetrics& metrics) {
  next_seq_ = from;
  if (!has_replay_) return;  // no replay: take the stream from here
  const std::string start = vllm_events::EncodeSeq(static_cast<int64_t>(from));
  const std::string_view frames[] = {"", start};
  if (SendFrames(replay_, frames, zmq::send_flags::dontwait).ok()) {
    replaying_ = true;
    replay_asked_ = absl::Now();
    metrics.replays->Increment();
  }
}

void VllmEventSource::ReadLive(const Callbacks& cb, UpstreamMetrics& metrics) {
  if (replaying_ && absl::Now() - replay_asked_ > kReplayGiveUp) {
    // The replay socket never answered (or its end marker was lost): take the live stream
    // from here rather than drop it for good; chains whose parents were missed are orphans.
    LOG(WARNING) << "upstream rank " << rank_ << ": no replay after " << kReplayGiveUp
                 << "; reading the live events from here";
    replaying_ = false;
    take_next_live_ = held_.empty();
    if (!held_.empty()) next_seq_ = held_.begin()->first;  // what was held starts the stream
    TakeHeld(cb, metrics);
  }
  for (int i = 0; i < 1000; ++i) {
    absl::StatusOr<std::optional<std::vector<std::string>>> f =
        ReceiveFrames(sub_, zmq::recv_flags::dontwait);
    if (!f.ok() || !f->has_value()) return;
    const std::vector<std::string>& frames = **f;
    if (frames.size() != 3 || frames[1].size() != 8) continue;
    const uint64_t seq = static_cast<uint64_t>(vllm_events::DecodeSeq(frames[1]));
    if (take_next_live_ && !replaying_) {
      take_next_live_ = false;
      next_seq_ = seq;
    }
    if (replaying_) {
      // Held until the replay ends: one published after the replay was answered comes only
      // here, and dropping it would lose it until the next gap.
      if (seq >= next_seq_ && held_.size() < kMaxHeld) held_.emplace(seq, frames[2]);
      continue;
    }
    if (seq < next_seq_) {
      if (seq == 0 && next_seq_ > 1) {  // the engine restarted
        cb.restart();                   // (which asks for a replay from 0)
        if (!replaying_) {
          next_seq_ = 1;
          cb.batch(0, frames[2]);
        }
      }
      continue;
    }
    if (seq > next_seq_) {  // missed some: read them again from the replay socket
      metrics.gaps->Increment();
      AskReplay(next_seq_, metrics);
      if (replaying_) continue;
    }
    next_seq_ = seq + 1;
    cb.batch(seq, frames[2]);
  }
}

void VllmEventSource::ReadReplay(const Callbacks& cb, UpstreamMetrics& metrics) {
  if (!has_replay_) return;
  for (int i = 0; i < 10000; ++i) {
    absl::StatusOr<std::optional<std::vector<std::string>>> f =
        ReceiveFrames(replay_, zmq::recv_flags::dontwait);
    if (!f.ok() || !f->has_value()) return;
    std::vector<std::string> frames = **f;
    if (!frames.empty() && frames[0].empty()) frames.erase(frames.begin());  // the delimiter
    if (frames.size() != 2 || frames[0].size() != 8) continue;
    const int64_t signed_seq = vllm_events::DecodeSeq(frames[0]);
    const uint64_t seq = static_cast<uint64_t>(signed_seq);
    if (signed_seq == vllm_events::kReplayEnd) {
      replaying_ = false;
      TakeHeld(cb, metrics);
      continue;
    }
    if (seq >= next_seq_) {
      next_seq_ = seq + 1;
      cb.batch(seq, frames[1]);
    }
  }
}

absl::StatusOr<std::vector<VllmEventEndpoints>> RankEndpoints(const VllmEventEndpoints& first,
                                                              int ranks) {
  if (ranks < 1) return absl::InvalidArgumentError("--data-parallel-size must be >= 1");
  // "tcp://host:5557" with the port + r; ipc and inproc endpoints have no port.
  const auto shifted = [&](const std::string& endpoint, int r) -> absl::StatusOr<std::string> {
    if (endpoint.empty() || r == 0) return endpoint;
    const size_t colon = endpoint.rfind(':');
    int port = 0;
    if (endpoint.rfind("tcp://", 0) != 0 || colon == std::string::npos ||
        !absl::SimpleAtoi(endpoint.substr(colon + 1), &port)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--data-parallel-size ", ranks,
                       " needs tcp://HOST:PORT event endpoints (rank r at "
                       "PORT + r, as vLLM publishes them), not '",
                       endpoint, "'"));
    }
    return absl::StrCat(endpoint.substr(0, colon + 1), port + r);
  };
  std::vector<VllmEventEndpoints> out;
  for (int r = 0; r < ranks; ++r) {
    VllmEventEndpoints e = first;
    ASSIGN_OR_RETURN(e.events, shifted(first.events, r));
    ASSIGN_OR_RETURN(e.replay, shifted(first.replay, r));
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace kvserve::upstream
