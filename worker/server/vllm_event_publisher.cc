#include "worker/server/vllm_event_publisher.h"

#include <deque>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/kv/vllm_kv_events.h"
#include "glog/logging.h"

namespace kvserve::worker {
namespace {

// vLLM binds an endpoint with a wildcard host or a local transport and connects to any other.
bool Binds(const std::string& endpoint) {
  return endpoint.find('*') != std::string::npos || endpoint.find("::") != std::string::npos ||
         endpoint.rfind("ipc://", 0) == 0 || endpoint.rfind("inproc://", 0) == 0;
}

void SendFrames(zmq::socket_t& s, const std::vector<zmq::const_buffer>& frames) {
  for (size_t i = 0; i < frames.size(); ++i) {
    const auto more = i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none;
    s.send(frames[i], more | zmq::send_flags::dontwait);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<VllmEventPublisher>> VllmEventPublisher::Start(
    zmq::context_t& ctx, const VllmEventsConfig& config) {
  std::unique_ptr<VllmEventPublisher> p(new VllmEventPublisher(ctx));
  p->config_ = config;
  static std::atomic<int> pipes{0};
  p->pipe_address_ = absl::StrCat("inproc://vllm-kv-events-", pipes++);
  try {
    p->out_ = std::make_unique<zmq::socket_t>(ctx, zmq::socket_type::pull);
    p->out_->set(zmq::sockopt::rcvhwm, static_cast<int>(config.max_queue_size));
    p->out_->bind(p->pipe_address_);
    p->in_ = std::make_unique<zmq::socket_t>(ctx, zmq::socket_type::push);
    p->in_->set(zmq::sockopt::sndhwm, static_cast<int>(config.max_queue_size));
    p->in_->set(zmq::sockopt::linger, 1000);
    p->in_->connect(p->pipe_address_);
    p->pub_ = std::make_unique<zmq::socket_t>(ctx, zmq::socket_type::pub);
    p->pub_->set(zmq::sockopt::sndhwm, static_cast<int>(config.hwm));
    p->pub_->set(zmq::sockopt::linger, 1000);
    if (Binds(config.endpoint)) {
      p->pub_->bind(config.endpoint);
      p->endpoint_ = p->pub_->get(zmq::sockopt::last_endpoint);
    } else {
      p->pub_->connect(config.endpoint);
      p->endpoint_ = config.endpoint;
    }
    if (config.replay_endpoint) {
      p->replay_ = std::make_unique<zmq::socket_t>(ctx, zmq::socket_type::router);
      p->replay_->set(zmq::sockopt::linger, 0);
      p->replay_->bind(*config.replay_endpoint);
      p->replay_endpoint_ = p->replay_->get(zmq::sockopt::last_endpoint);
    }
  } catch (const zmq::error_t& e) {
    return absl::UnavailableError(
        absl::StrCat("--kv-events-config: cannot open ", config.endpoint, " / ",
                     config.replay_endpoint.value_or("(no replay)"), ": ", e.what()));
  }
  p->thread_ = std::thread([raw = p.get()] { raw->Loop(); });
  return p;
}

VllmEventPublisher::~VllmEventPublisher() {
  if (in_) {
    // Empty: stop after the rest. A thread that already stopped on an error takes nothing, so
    // the send gives up after a while rather than waiting on a full queue for ever.
    in_->set(zmq::sockopt::sndtimeo, 2000);
    try {
      in_->send(zmq::const_buffer(), zmq::send_flags::none);
    } catch (const zmq::error_t&) {
    }
    in_.reset();
  }
  if (thread_.joinable()) thread_.join();
}

void VllmEventPublisher::Publish(std::string payload) {
  if (payload.empty()) return;  // an empty message means stop
  zmq::message_t m(payload.data(), payload.size());
  if (!in_->send(m, zmq::send_flags::dontwait)) {
    if (dropped_.fetch_add(1) % 1000 == 0) {
      LOG(WARNING) << "vLLM KV events: the publisher queue is full (max_queue_size "
                   << config_.max_queue_size << "); " << dropped_.load() << " batches dropped";
    }
  }
}

void VllmEventPublisher::Loop() {
  std::vector<zmq::pollitem_t> items = {{out_->handle(), 0, ZMQ_POLLIN, 0}};
  if (replay_) items.push_back({replay_->handle(), 0, ZMQ_POLLIN, 0});
  bool running = true;
  while (running) {
    try {
      zmq::poll(items.data(), items.size(), std::chrono::milliseconds(-1));
      if (items[0].revents & ZMQ_POLLIN) running = SendNext();
      if (replay_ && (items[1].revents & ZMQ_POLLIN)) ServeReplay();
    } catch (const zmq::error_t& e) {
      // A signal (the worker's SIGTERM may land on this thread) interrupts a wait: go on.
      if (e.num() == EINTR) continue;
      LOG(ERROR) << "vLLM KV events: " << e.what() << "; the publisher stops";
      running = false;
    }
  }
  out_.reset();
  pub_.reset();
  replay_.reset();
}

bool VllmEventPublisher::SendNext() {
  zmq::message_t m;
  if (!out_->recv(m, zmq::recv_flags::dontwait)) return true;
  if (m.size() == 0) return false;  // the destructor's stop, after every batch before it
  std::string payload = m.to_string();
  const std::string seq_bytes = vllm_events::EncodeSeq(next_seq_);
  SendFrames(*pub_, {zmq::buffer(config_.topic), zmq::buffer(seq_bytes), zmq::buffer(payload)});
  kept_.emplace_back(next_seq_++, std::move(payload));
  published_.fetch_add(1);
  if (static_cast<int64_t>(kept_.size()) > config_.buffer_steps) kept_.pop_front();
  return true;
}

void VllmEventPublisher::ServeReplay() {
  std::vector<zmq::message_t> frames;
  zmq::message_t f;
  do {
    if (!replay_->recv(f, zmq::recv_flags::dontwait)) break;
    frames.push_back(std::move(f));
  } while (frames.back().more() && frames.size() < 8);
  for (bool more = !frames.empty() && frames.back().more(); more; more = f.more()) {
    if (!replay_->recv(f)) break;  // the rest of an over-long request, dropped
  }
  // [identity, "", start]: anything else is not a replay request and gets no answer.
  if (frames.size() != 3 || frames[1].size() != 0 || frames[2].size() != 8) {
    LOG(WARNING) << "vLLM KV events: a malformed replay request (" << frames.size()
                 << " frames) was ignored";
    return;
  }
  const std::string id = frames[0].to_string();
  const int64_t start = vllm_events::DecodeSeq(frames[2].to_string_view());
  for (const auto& [seq, payload] : kept_) {
    if (seq < start) continue;
    const std::string seq_bytes = vllm_events::EncodeSeq(seq);
    SendFrames(*replay_, {zmq::buffer(id), zmq::const_buffer(), zmq::buffer(seq_bytes),
                          zmq::buffer(payload)});
  }
  const std::string end = vllm_events::EncodeSeq(vllm_events::kReplayEnd);
  SendFrames(*replay_,
             {zmq::buffer(id), zmq::const_buffer(), zmq::buffer(end), zmq::const_buffer()});
}

}  // namespace kvserve::worker
