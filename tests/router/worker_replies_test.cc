// A worker that breaks the protocol, behind a real router front (HttpFront + RouterCore): more
// tokens than max_tokens, more logprob alternatives than asked, a sample index past n, a cached
// count past the prompt, an error code outside absl's range, a hang while draining, replies out
// of sequence. The client gets what it asked for and a clean error, never the worker's excess or
// an endless wait.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <future>
#include <thread>

#include "common/zmq_framing.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "router/http_front.h"
#include "router/router_core.h"
#include "router/router_metrics.h"
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

// Heartbeats as a ready worker; answers each request with `reply(request)`'s messages, numbered
// 1, 2, 3, ... unless a message sets its own seq.
class BrokenWorker {
 public:
  using Reply = std::function<std::vector<pb::GenerateResponse>(const pb::GenerateRequest&)>;
  explicit BrokenWorker(Reply reply) : reply_(std::move(reply)) {
    pub_.bind("tcp://127.0.0.1:*");
    router_.bind("tcp://127.0.0.1:*");
    port_ = BoundPort(router_);
    events_port_ = BoundPort(pub_);
    thread_ = std::thread([this] { Loop(); });
  }
  ~BrokenWorker() {
    stop_ = true;
    thread_.join();
  }
  int port() const { return port_; }
  int events_port() const { return events_port_; }
  // The state its heartbeats report from now on.
  void SetState(pb::WorkerState state) { state_ = state; }
  // Stops heartbeating and answering, like a process that hangs.
  void Freeze() { frozen_ = true; }

 private:
  void Loop() {
    pb::WorkerStatus st;
    st.set_instance_id(1);
    st.set_state(pb::WORKER_STATE_READY);
    st.set_model_id("tiny");
    st.set_block_size(16);
    pb::BlockCounts* b = st.add_blocks();
    b->set_medium(pb::MEDIUM_DEVICE);
    b->set_total(64);
    b->set_free(64);
    while (!stop_) {
      if (frozen_) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        continue;
      }
      st.set_state(state_.load());
      SendMessage(pub_, "status", st).IgnoreError();
      zmq::pollitem_t item{router_.handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, std::chrono::milliseconds(50));
      if (!(item.revents & ZMQ_POLLIN)) continue;
      auto m = ReceiveMessage(router_, /*with_prefix=*/true);
      pb::GenerateRequest req;
      if (!m.ok() || !m->has_value() || !ParseMessage(**m, &req).ok()) continue;
      uint32_t seq = 0;
      for (pb::GenerateResponse r : reply_(req)) {
        if (r.seq() == 0) r.set_seq(++seq);  // numbered as a worker numbers them, unless set
        seq = r.seq();
        SendMessage(router_, (*m)->prefix, r).IgnoreError();
      }
    }
  }

  Reply reply_;
  zmq::context_t ctx_;
  zmq::socket_t pub_{ctx_, zmq::socket_type::pub}, router_{ctx_, zmq::socket_type::router};
  int port_ = 0, events_port_ = 0;
  std::atomic<pb::WorkerState> state_{pb::WORKER_STATE_READY};
  std::atomic<bool> stop_{false}, frozen_{false};
  std::thread thread_;
};

// POST `body` to path; returns {status, parsed body}.
std::pair<int, json> Post(int port, const std::string& path, const json& body) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  const std::string text = body.dump();
  const std::string req =
      "POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" +
      "Connection: close\r\nContent-Length: " + std::to_string(text.size()) + "\r\n\r\n" + text;
  EXPECT_EQ(write(fd, req.data(), req.size()), static_cast<ssize_t>(req.size()));
  std::string out;
  char buf[8192];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) out.append(buf, n);
  close(fd);
  const size_t body_at = out.find("\r\n\r\n");
  if (out.size() < 12 || body_at == std::string::npos) return {0, nullptr};
  return {std::stoi(out.substr(9, 3)), json::parse(out.substr(body_at + 4), nullptr, false)};
}

class WorkerRepliesTest : public ::testing::Test {
 protected:
  void Start(BrokenWorker::Reply reply) {
    worker_ = std::make_unique<BrokenWorker>(std::move(reply));
    ASSERT_OK_AND_ASSIGN(tokenizer_, tokenizer::Tokenizer::FromDirectory(
                                         kvserve::testing::NpmTokenizerDir("llama3")));
    RouterOptions o;
    o.workers.push_back({"broken", "127.0.0.1", worker_->port(), worker_->events_port()});
    o.heartbeat_timeout = absl::Milliseconds(500);
    o.metrics = &metrics_;
    core_ = std::make_unique<RouterCore>(o);
    core_->Start();
    FrontOptions f;
    f.host = "127.0.0.1";
    f.port = 0;
    f.served_model_name = "tiny";
    f.max_model_len = 256;
    ASSERT_OK_AND_ASSIGN(front_, HttpFront::Start(f, tokenizer_.get(), core_.get(), &metrics_));
    const auto eligible = [&] {
      const std::vector<WorkerInfo> w = core_->Workers();
      return !w.empty() && w[0].eligible;
    };
    for (int i = 0; i < 250 && !eligible(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ASSERT_TRUE(eligible());
  }
  void TearDown() override {
    if (front_) front_->Stop();
    core_.reset();
    front_.reset();
    worker_.reset();
  }

  std::unique_ptr<BrokenWorker> worker_;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  RouterMetrics metrics_;
  std::unique_ptr<RouterCore> core_;
  std::unique_ptr<HttpFront> front_;
};

TEST_F(WorkerRepliesTest, ExcessFromAWorkerNeverReachesTheClient) {
  Start([](const pb::GenerateRequest& req) {
    std::vector<pb::GenerateResponse> out;
    for (int sample : {0, 7}) {  // 7: past n
      pb::GenerateResponse r;
      r.set_request_id(req.request_id());
      r.set_sample_index(sample);
      for (int t = 0; t < 50; ++t) {  // far past max_tokens
        r.add_token_ids(1000 + t);
        pb::PositionLogprobs* lp = r.add_logprobs();
        lp->mutable_sampled()->set_token_id(1000 + t);
        for (int k = 0; k < 30; ++k) lp->add_top()->set_token_id(2000 + k);  // past top 2
      }
      out.push_back(r);
    }
    pb::GenerateResponse last;
    last.set_request_id(req.request_id());
    last.set_finish_reason(pb::FINISH_REASON_LENGTH);
    last.mutable_usage()->set_cached_prompt_tokens(1 << 30);
    out.push_back(last);
    return out;
  });
  auto [status, body] =
      Post(front_->port(), "/v1/completions",
           {{"model", "tiny"}, {"prompt", "hello"}, {"max_tokens", 4}, {"logprobs", 2}});
  ASSERT_EQ(status, 200) << body.dump();
  ASSERT_EQ(body["choices"].size(), 1u);
  EXPECT_EQ(body["usage"]["completion_tokens"], 4);
  const int prompt_tokens = body["usage"]["prompt_tokens"];
  EXPECT_LE(body["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), prompt_tokens);
  const json& lp = body["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"].size(), 4u);
  for (const json& top : lp["top_logprobs"]) EXPECT_LE(top.size(), 2u);
}

TEST_F(WorkerRepliesTest, AnErrorCodeOutsideAbslsRangeIsAnInternalError) {
  Start([](const pb::GenerateRequest& req) {
    pb::GenerateResponse r;
    r.set_request_id(req.request_id());
    r.set_finish_reason(pb::FINISH_REASON_ERROR);
    r.mutable_error()->set_code(12345);
    r.mutable_error()->set_message("boom");
    return std::vector<pb::GenerateResponse>{r};
  });
  auto [status, body] = Post(front_->port(), "/v1/completions",
                             {{"model", "tiny"}, {"prompt", "hi"}, {"max_tokens", 2}});
  EXPECT_EQ(status, 500) << body.dump();
  EXPECT_NE(body["error"]["message"].get<std::string>().find("boom"), std::string::npos);
}

// Issue 26: the router trusted a draining worker whatever its heartbeat's age, so a worker that
// hung while draining left its requests waiting forever.
TEST_F(WorkerRepliesTest, AWorkerThatHangsWhileDrainingFailsItsRequests) {
  Start([](const pb::GenerateRequest& req) {
    pb::GenerateResponse r;  // one token, then nothing: the request stays in flight
    r.set_request_id(req.request_id());
    r.add_token_ids(1000);
    return std::vector<pb::GenerateResponse>{r};
  });
  auto job = std::make_shared<Job>();
  job->request.set_request_id("r1");
  job->request.add_prompt_token_ids(1);
  job->request.set_max_tokens(100);
  auto tokens = std::make_shared<std::atomic<int>>(0);
  auto failed = std::make_shared<std::promise<std::string>>();
  job->on_response = [tokens, failed](const pb::GenerateResponse& r) {
    *tokens += r.token_ids_size();
    if (r.finish_reason() == pb::FINISH_REASON_ERROR) failed->set_value(r.error().message());
  };
  std::future<std::string> error = failed->get_future();
  core_->Submit(job);
  for (int i = 0; i < 250 && *tokens == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(*tokens, 1);
  worker_->SetState(pb::WORKER_STATE_DRAINING);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the router sees it draining
  worker_->Freeze();
  // Ends within the heartbeat timeout plus a turn of the core; the wait is only a hang guard.
  ASSERT_EQ(error.wait_for(std::chrono::seconds(20)), std::future_status::ready)
      << "the request hangs on a worker that stopped while draining";
  EXPECT_THAT(error.get(), ::testing::HasSubstr("stopped responding"));
}

// Issue 26: replies carried no sequence number, so a reply lost on the link was missing text
// or a request that never ended. A gap (or a repeat) now ends the request with a clear error,
// counted per worker.
TEST_F(WorkerRepliesTest, ARepliesGapEndsTheRequestWithAClearError) {
  Start([](const pb::GenerateRequest& req) {
    std::vector<pb::GenerateResponse> out(2);
    for (pb::GenerateResponse& r : out) r.set_request_id(req.request_id());
    out[0].add_token_ids(1000);
    out[1].set_seq(req.prompt_token_ids_size() > 3 ? 1 : 3);  // a repeat of 1, or 2 missing
    out[1].set_finish_reason(pb::FINISH_REASON_LENGTH);
    out[1].mutable_usage()->set_prompt_tokens(1);
    return out;
  });
  for (const char* prompt : {"hi", "one two three four five six"}) {
    auto [status, body] = Post(front_->port(), "/v1/completions",
                               {{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 2}});
    EXPECT_EQ(status, 503) << body.dump();
    EXPECT_THAT(body["error"]["message"].get<std::string>(), ::testing::HasSubstr("were lost"));
  }
  EXPECT_EQ(core_->reply_gaps(), 2);
  EXPECT_THAT(metrics_.Serialize(),
              ::testing::HasSubstr("kvserve_router_reply_gaps_total{worker=\"broken\"} 2"));
}

}  // namespace
}  // namespace kvserve::router
