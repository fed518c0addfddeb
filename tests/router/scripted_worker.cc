#include "tests/router/scripted_worker.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/net/zmq_framing.h"
#include "tests/testing/paths.h"
#include "tests/testing/status_matchers.h"

namespace kvserve::router {
namespace {

namespace pb = ::kvserve::v1;
using json = nlohmann::json;

int BoundPort(zmq::socket_t& s) {
  const std::string e = s.get(zmq::sockopt::last_endpoint);
  return std::stoi(e.substr(e.rfind(':') + 1));
}

}  // namespace

ScriptedWorker::ScriptedWorker(Reply reply, std::chrono::microseconds pace, bool link)
    : reply_(std::move(reply)), pace_(pace) {
  router_.set(zmq::sockopt::sndhwm, 0);  // a long script in one burst: none of it dropped
  pub_.bind("tcp://127.0.0.1:*");
  router_.bind("tcp://127.0.0.1:*");
  port_ = BoundPort(router_);
  events_port_ = BoundPort(pub_);
  if (link) link_listener_ = kvserve::testing::ListenLoopback(&link_port_, /*nonblocking=*/true);
  thread_ = std::thread([this] { Loop(); });
}

ScriptedWorker::~ScriptedWorker() {
  stop_ = true;
  thread_.join();
  if (link_listener_ >= 0) close(link_listener_);
}

void ScriptedWorker::Send(const std::string& peer, const pb::GenerateResponse& r) {
  if (peer != kLinkPeer) {
    SendMessage(router_, peer, r).IgnoreError();
  } else if (link_ != nullptr && link_->Queue(r).ok()) {
    link_->Flush().IgnoreError();
  }
}

void ScriptedWorker::ServeLink() {
  if (link_listener_ < 0) return;
  if (drop_link_.exchange(false)) link_.reset();
  if (link_ == nullptr) {
    const int fd = accept4(link_listener_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) return;
    link_ = std::make_unique<FrameLink>(fd, FrameLink::Options{});
    ++links_;
  }
  std::vector<ReceivedMessage> got;
  if (!link_->Flush().ok() || !link_->Read(got, 64).ok()) {
    link_.reset();
    return;
  }
  for (const ReceivedMessage& m : got) {
    pb::GenerateRequest req;
    if (m.type == "GenerateRequest" && ParseMessage(m, &req).ok()) Answer(kLinkPeer, req);
  }
}

void ScriptedWorker::Heartbeat() {
  const auto now = std::chrono::steady_clock::now();
  if (now - last_heartbeat_ < std::chrono::milliseconds(50)) return;
  last_heartbeat_ = now;
  pb::WorkerStatus st;
  st.set_instance_id(1);
  st.set_model_id("tiny");
  st.set_block_size(16);
  pb::BlockCounts* b = st.add_blocks();
  b->set_medium(pb::MEDIUM_DEVICE);
  b->set_total(64);
  b->set_free(64);
  st.set_state(state_.load());
  st.set_max_num_seqs(max_num_seqs_.load());
  st.set_link_port(link_port_);
  SendMessage(pub_, "status", st).IgnoreError();
}

void ScriptedWorker::Loop() {
  while (!stop_) {
    if (frozen_) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    Heartbeat();
    if (!holding_ && !held_.empty()) {
      for (const auto& [peer, r] : held_) Send(peer, r);
      held_.clear();
      held_count_ = 0;
    }
    ServeLink();
    zmq::pollitem_t item{router_.handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, std::chrono::milliseconds(link_listener_ >= 0 ? 5 : 50));
    if (!(item.revents & ZMQ_POLLIN)) continue;
    auto m = ReceiveMessage(router_, /*with_prefix=*/true);
    if (!m.ok() || !m->has_value()) continue;
    pb::GenerateRequest req;
    if (ParseMessage(**m, &req).ok()) {
      Answer((*m)->prefix, req);
    } else if ((*m)->type == "AbortRequest") {
      ++aborts_;
    }
  }
}

bool ScriptedWorker::ReceiveAbort(std::chrono::microseconds timeout) {
  zmq::pollitem_t item{router_.handle(), 0, ZMQ_POLLIN, 0};
  zmq::poll(&item, 1, std::chrono::duration_cast<std::chrono::milliseconds>(timeout));
  if (!(item.revents & ZMQ_POLLIN)) return false;
  auto m = ReceiveMessage(router_, /*with_prefix=*/true);
  if (!m.ok() || !m->has_value() || (*m)->type != "AbortRequest") return false;
  ++aborts_;
  return true;
}

void ScriptedWorker::Answer(const std::string& peer, const pb::GenerateRequest& req) {
  uint32_t seq = 0;
  std::vector<pb::GenerateResponse> replies = reply_(req);
  for (size_t i = 0; i < replies.size(); ++i) {
    pb::GenerateResponse& r = replies[i];
    if (r.seq() == 0) r.set_seq(++seq);  // numbered as a worker numbers them, unless set
    seq = r.seq();
    if (holding_ && i + 1 == replies.size()) {
      held_.emplace_back(peer, r);
      ++held_count_;
      return;
    }
    Send(peer, r);
    if (pace_.count() == 0) continue;
    Heartbeat();
    if (ReceiveAbort(pace_)) return;
  }
}

std::vector<kvserve::v1::GenerateResponse> OneToken(const kvserve::v1::GenerateRequest& req) {
  std::vector<kvserve::v1::GenerateResponse> out(2);
  for (kvserve::v1::GenerateResponse& r : out) r.set_request_id(req.request_id());
  out[0].add_token_ids(1000);
  out[1].set_finish_reason(kvserve::v1::FINISH_REASON_LENGTH);
  out[1].mutable_usage()->set_prompt_tokens(req.prompt_token_ids_size());
  return out;
}

FrontOptions TinyFront() {
  FrontOptions f;
  f.served_model_name = "tiny";
  f.max_model_len = 256;
  return f;
}

void ScriptedFrontTest::Start(ScriptedWorker::Reply reply, FrontOptions f,
                              std::chrono::microseconds pace) {
  worker_ = std::make_unique<ScriptedWorker>(std::move(reply), pace, worker_link_);
  ASSERT_OK_AND_ASSIGN(
      tokenizer_, tokenizer::Tokenizer::FromDirectory(kvserve::testing::NpmTokenizerDir("llama3")));
  RouterOptions o = router_options_;
  o.workers.push_back({"scripted", "127.0.0.1", worker_->port(), worker_->events_port()});
  o.heartbeat_timeout = absl::Milliseconds(500);
  o.metrics = &metrics_;
  core_ = std::make_unique<RouterCore>(o);
  if (f.api_threads > 0) core_->Start();
  f.host = "127.0.0.1";
  f.port = 0;
  ASSERT_OK_AND_ASSIGN(front_, HttpFront::Start(f, tokenizer_.get(), core_.get(), &metrics_));
  if (f.api_threads == 0) core_->StartOn(front_->io());  // as kvserve-router --api-threads 0
  const auto eligible = [&] {
    const std::vector<WorkerInfo> w = core_->Workers();
    return !w.empty() && w[0].eligible;
  };
  for (int i = 0; i < 250 && !eligible(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(eligible());
}

void ScriptedFrontTest::TearDown() {
  if (front_) front_->Stop();
  core_.reset();
  front_.reset();
  worker_.reset();
}

std::string PostRaw(int port, const std::string& path, const json& body,
                    const std::string& headers) {
  const int fd = kvserve::testing::ConnectLoopback(port);
  EXPECT_GE(fd, 0);
  timeval tv{30, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  const std::string text = body.dump();
  const std::string req =
      "POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + headers +
      "Connection: close\r\nContent-Length: " + std::to_string(text.size()) + "\r\n\r\n" + text;
  EXPECT_EQ(write(fd, req.data(), req.size()), static_cast<ssize_t>(req.size()));
  std::string out;
  char buf[8192];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) out.append(buf, n);
  close(fd);
  return out;
}

std::pair<int, json> Post(int port, const std::string& path, const json& body,
                          const std::string& headers) {
  const std::string out = PostRaw(port, path, body, headers);
  const size_t body_at = out.find("\r\n\r\n");
  if (out.size() < 12 || body_at == std::string::npos) return {0, nullptr};
  return {std::stoi(out.substr(9, 3)), json::parse(out.substr(body_at + 4), nullptr, false)};
}

}  // namespace kvserve::router
