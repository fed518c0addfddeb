// LocalCore (kvserve-worker --openai-port's core) against a ScriptedWorker: requests go to the
// worker and its replies come back in order; the admission queue holds what the worker's limit
// leaves no room for; deadlines, lost replies, a draining worker and a silent one end requests
// with the router's status codes; picks and unknown worker names are refused.
#include "worker/openai/local_core.h"

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/router/scripted_worker.h"

namespace kvserve::worker {
namespace {

namespace pb = ::kvserve::v1;
using router::OneToken;
using router::ScriptedWorker;
using ::testing::HasSubstr;

bool WaitFor(const std::function<bool()>& done,
             std::chrono::milliseconds limit = std::chrono::milliseconds(5000)) {
  const auto give_up = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > give_up) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// A job whose replies are kept (on_response runs on the core thread; the replies outlive the
// test's object, as the core may still hold the job).
class Recorded {
 public:
  explicit Recorded(const std::string& id, int n = 1) : job_(std::make_shared<frontend::Job>()) {
    job_->request.set_request_id(id);
    job_->request.add_prompt_token_ids(1);
    job_->request.set_max_tokens(1);
    job_->request.mutable_sampling()->set_n(n);
    job_->on_response = [state = state_](const pb::GenerateResponse& r) {
      absl::MutexLock lock(&state->mu);
      state->replies.push_back(r);
    };
  }
  std::shared_ptr<frontend::Job> job() const { return job_; }
  std::vector<pb::GenerateResponse> replies() const {
    absl::MutexLock lock(&state_->mu);
    return state_->replies;
  }
  // Whether the request ended (a reply with usage, or an error).
  bool ended() const {
    const std::vector<pb::GenerateResponse> r = replies();
    return !r.empty() &&
           (r.back().has_usage() || r.back().finish_reason() == pb::FINISH_REASON_ERROR);
  }
  absl::StatusCode error() const {
    const std::vector<pb::GenerateResponse> r = replies();
    if (r.empty() || r.back().finish_reason() != pb::FINISH_REASON_ERROR) {
      return absl::StatusCode::kOk;
    }
    return static_cast<absl::StatusCode>(r.back().error().code());
  }
  std::string message() const {
    const std::vector<pb::GenerateResponse> r = replies();
    return r.empty() ? "" : r.back().error().message();
  }

 private:
  struct State {
    absl::Mutex mu;
    std::vector<pb::GenerateResponse> replies ABSL_GUARDED_BY(mu);
  };
  std::shared_ptr<State> state_ = std::make_shared<State>();
  std::shared_ptr<frontend::Job> job_;
};

class LocalCoreTest : public ::testing::Test {
 protected:
  void Start(ScriptedWorker::Reply reply) {
    worker_ = std::make_unique<ScriptedWorker>(std::move(reply));
    options_.port = worker_->port();
    options_.events_port = worker_->events_port();
    options_.metrics = &metrics_;
    core_ = std::make_unique<LocalCore>(options_);
    core_->Start();
    ASSERT_TRUE(WaitFor([&] { return core_->eligible_workers() == 1; })) << "no heartbeat";
  }
  void TearDown() override {
    if (core_) core_->Stop();
  }

  LocalCoreOptions options_;
  frontend::FrontMetrics metrics_;
  std::unique_ptr<ScriptedWorker> worker_;
  std::unique_ptr<LocalCore> core_;
};

TEST_F(LocalCoreTest, ARequestIsAnsweredInOrderAndTheAdminApiShowsTheWorker) {
  Start(OneToken);
  Recorded a("a");
  core_->Submit(a.job());
  ASSERT_TRUE(WaitFor([&] { return a.ended(); }));
  const std::vector<pb::GenerateResponse> r = a.replies();
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].token_ids(0), 1000);
  EXPECT_EQ(r[1].finish_reason(), pb::FINISH_REASON_LENGTH);
  EXPECT_EQ(core_->known_workers(), 1);
  ASSERT_TRUE(WaitFor([&] { return core_->Workers()[0].state == "WORKER_STATE_READY"; }));
  EXPECT_EQ(core_->Workers()[0].name, "self");
  EXPECT_TRUE(core_->Control("self", pb::CONTROL_ACTION_UNDRAIN).ok());
  EXPECT_EQ(core_->Control("other", pb::CONTROL_ACTION_DRAIN).code(), absl::StatusCode::kNotFound);
}

TEST_F(LocalCoreTest, ARequestPastTheWorkersLimitWaitsThenRuns) {
  Start(OneToken);
  worker_->SetMaxNumSeqs(2);
  worker_->Hold(true);
  ASSERT_TRUE(WaitFor([&] { return core_->Workers()[0].inflight_limit == 2; }));
  Recorded a("a"), b("b"), c("c");
  for (const Recorded* r : {&a, &b, &c}) core_->Submit(r->job());
  ASSERT_TRUE(WaitFor([&] { return worker_->held() == 2; }));
  // The third waits once the core has taken it from its inbox (it may still be there now).
  EXPECT_TRUE(WaitFor([&] {
    return absl::StrContains(metrics_.Serialize(), "kvserve_router_queue_depth 1");
  })) << metrics_.Serialize();
  worker_->Hold(false);
  ASSERT_TRUE(WaitFor([&] { return a.ended() && b.ended() && c.ended(); }));
  EXPECT_EQ(c.error(), absl::StatusCode::kOk);
}

TEST_F(LocalCoreTest, AFullQueueRefusesAndADeadlineEndsARunningRequest) {
  options_.admission.max_queued = 0;
  Start(OneToken);
  worker_->SetMaxNumSeqs(1);
  worker_->Hold(true);
  ASSERT_TRUE(WaitFor([&] { return core_->Workers()[0].inflight_limit == 1; }));
  Recorded a("a"), b("b");
  a.job()->deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
  core_->Submit(a.job());
  ASSERT_TRUE(WaitFor([&] { return worker_->held() == 1; }));
  core_->Submit(b.job());
  ASSERT_TRUE(WaitFor([&] { return b.ended(); }));
  EXPECT_EQ(b.error(), absl::StatusCode::kResourceExhausted) << b.message();
  ASSERT_TRUE(WaitFor([&] { return a.ended(); }));
  EXPECT_EQ(a.error(), absl::StatusCode::kDeadlineExceeded) << a.message();
  EXPECT_TRUE(WaitFor([&] { return worker_->aborts() == 1; })) << "aborted on the worker";
}

TEST_F(LocalCoreTest, ALostReplyEndsTheRequestAndAbortsIt) {
  Start([](const pb::GenerateRequest& req) {
    std::vector<pb::GenerateResponse> out = OneToken(req);
    out[1].set_seq(3);  // reply 2 never came
    return out;
  });
  Recorded a("a");
  core_->Submit(a.job());
  ASSERT_TRUE(WaitFor([&] { return a.ended(); }));
  EXPECT_EQ(a.error(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(a.message(), HasSubstr("lost"));
  EXPECT_TRUE(WaitFor([&] { return worker_->aborts() == 1; }));
}

TEST_F(LocalCoreTest, ADrainingWorkerTakesNothingAndPicksAreRefused) {
  Start(OneToken);
  worker_->SetState(pb::WORKER_STATE_DRAINING);
  ASSERT_TRUE(WaitFor([&] { return core_->eligible_workers() == 0; }));
  Recorded a("a");
  core_->Submit(a.job());
  ASSERT_TRUE(WaitFor([&] { return a.ended(); }));
  EXPECT_EQ(a.error(), absl::StatusCode::kUnavailable);
  Recorded pick("pick");
  pick.job()->pick = frontend::Job::Pick{};
  core_->Submit(pick.job());
  ASSERT_TRUE(WaitFor([&] { return pick.ended(); }));
  EXPECT_EQ(pick.error(), absl::StatusCode::kUnimplemented) << pick.message();
}

TEST_F(LocalCoreTest, AWorkerThatGoesSilentFailsItsRequests) {
  options_.heartbeat_timeout = absl::Milliseconds(300);
  Start(OneToken);
  worker_->Hold(true);
  Recorded a("a");
  core_->Submit(a.job());
  ASSERT_TRUE(WaitFor([&] { return worker_->held() == 1; }));
  worker_->Freeze();
  ASSERT_TRUE(WaitFor([&] { return a.ended(); }));
  EXPECT_EQ(a.error(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(a.message(), HasSubstr("stopped responding"));
  EXPECT_EQ(core_->eligible_workers(), 0);
}

}  // namespace
}  // namespace kvserve::worker
