// Admission control and deadlines at the router (issue 26), against a ScriptedWorker that
// reports --max-num-seqs 2 and holds its requests open: a request past every worker's limit
// waits in the router's queue and runs once there is room; past the queue's depth, or after
// waiting too long, it gets a 429 with Retry-After; a request past its deadline (the router's
// --request-timeout-seconds or the client's X-Request-Timeout) gets a 504 and is aborted on its
// worker.
#include <future>
#include <string>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/router/scripted_worker.h"

namespace kvserve::router {
namespace {

namespace pb = ::kvserve::v1;
using json = nlohmann::json;
using ::testing::HasSubstr;
using ::testing::StartsWith;

const json kRequest = {{"model", "tiny"}, {"prompt", "hi"}, {"max_tokens", 1}};

class AdmissionTest : public ScriptedFrontTest {
 protected:
  // Starts the worker holding its requests, with room for two.
  void StartHolding(FrontOptions front = TinyFront()) {
    Start(OneToken, front);
    worker_->SetMaxNumSeqs(2);
    worker_->Hold(true);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // a heartbeat with the limit
  }
  // Sends a request from a thread of its own; its whole response comes in the future.
  std::future<std::string> Send(const std::string& headers = "") {
    return std::async(std::launch::async, [port = front_->port(), headers] {
      return PostRaw(port, "/v1/completions", kRequest, headers);
    });
  }
  // Waits (5 s at most) until `done` holds.
  static bool WaitFor(const std::function<bool()>& done) {
    for (int i = 0; i < 500 && !done(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return done();
  }
};

TEST_F(AdmissionTest, ARequestPastEveryWorkersLimitWaitsAtTheRouterThenRuns) {
  StartHolding();
  std::vector<std::future<std::string>> sent;
  for (int i = 0; i < 3; ++i) sent.push_back(Send());
  ASSERT_TRUE(WaitFor([&] { return worker_->held() == 2 && core_->queued() == 1; }))
      << "held " << worker_->held() << ", queued " << core_->queued();
  EXPECT_THAT(metrics_.Serialize(), HasSubstr("kvserve_router_queue_depth 1"));
  EXPECT_TRUE(WaitFor([&] {  // published with the workers' figures, every 50 ms
    return metrics_.Serialize().find(
               "kvserve_router_worker_inflight_requests{worker=\"scripted\"} 2") !=
           std::string::npos;
  }));
  worker_->Hold(false);
  for (auto& f : sent) EXPECT_THAT(f.get(), StartsWith("HTTP/1.1 200"));
  EXPECT_EQ(core_->queued(), 0);
  // Every request's wait is observed, 0 for those placed at once.
  EXPECT_THAT(metrics_.Serialize(), HasSubstr("kvserve_router_queue_wait_seconds_count 3"));
  EXPECT_THAT(metrics_.Serialize(),
              HasSubstr("kvserve_router_queue_wait_seconds_bucket{le=\"0.005\"} 2"));
  // The router's own latency counts the two placed at once, not the one that waited.
  EXPECT_THAT(metrics_.Serialize(),
              HasSubstr("kvserve_router_added_latency_seconds_count{stage=\"to_worker\"} 2"));
}

TEST_F(AdmissionTest, ARequestOfNSamplesTakesNOfTheLimit) {
  StartHolding();
  std::vector<std::future<std::string>> sent;
  sent.push_back(Send());
  ASSERT_TRUE(WaitFor([&] { return worker_->held() == 1; }));
  json two = kRequest;
  two["n"] = 2;  // 1 + 2 sequences is past the worker's 2: it waits
  sent.push_back(std::async(std::launch::async, [port = front_->port(), two] {
    return PostRaw(port, "/v1/completions", two);
  }));
  ASSERT_TRUE(WaitFor([&] { return core_->queued() == 1; }));
  worker_->Hold(false);
  for (auto& f : sent) EXPECT_THAT(f.get(), StartsWith("HTTP/1.1 200"));
  // A worker with nothing in flight takes a request of more samples than its limit.
  json three = kRequest;
  three["n"] = 3;
  EXPECT_THAT(PostRaw(front_->port(), "/v1/completions", three), StartsWith("HTTP/1.1 200"));
}

TEST_F(AdmissionTest, PastTheQueuesDepthA429WithRetryAfter) {
  router_options_.admission.max_queued = 1;
  StartHolding();
  std::vector<std::future<std::string>> sent;
  for (int i = 0; i < 3; ++i) sent.push_back(Send());
  ASSERT_TRUE(WaitFor([&] { return worker_->held() == 2 && core_->queued() == 1; }));
  const std::string refused = PostRaw(front_->port(), "/v1/completions", kRequest);
  EXPECT_THAT(refused, StartsWith("HTTP/1.1 429"));
  EXPECT_THAT(refused, HasSubstr("Retry-After: 1"));
  EXPECT_THAT(refused, HasSubstr("--max-queued-requests"));
  EXPECT_THAT(metrics_.Serialize(),
              HasSubstr("kvserve_router_rejected_requests_total{reason=\"queue_full\"} 1"));
  worker_->Hold(false);
  for (auto& f : sent) EXPECT_THAT(f.get(), StartsWith("HTTP/1.1 200"));
}

TEST_F(AdmissionTest, AStreamRefusedBeforeItRanGetsItsOwnStatus) {
  router_options_.admission.max_queued = 0;
  StartHolding();
  std::vector<std::future<std::string>> sent;
  for (int i = 0; i < 2; ++i) sent.push_back(Send());
  ASSERT_TRUE(WaitFor([&] { return worker_->held() == 2; }));
  json stream = kRequest;
  stream["stream"] = true;
  EXPECT_THAT(PostRaw(front_->port(), "/v1/completions", stream), StartsWith("HTTP/1.1 429"));
  worker_->Hold(false);
  for (auto& f : sent) EXPECT_THAT(f.get(), StartsWith("HTTP/1.1 200"));
}

TEST_F(AdmissionTest, ARequestThatWaitsTooLongGetsA429) {
  router_options_.admission.max_queue_wait = absl::Milliseconds(300);
  StartHolding();
  std::vector<std::future<std::string>> sent;
  for (int i = 0; i < 2; ++i) sent.push_back(Send());
  ASSERT_TRUE(WaitFor([&] { return worker_->held() == 2; }));
  const std::string refused = PostRaw(front_->port(), "/v1/completions", kRequest);
  EXPECT_THAT(refused, StartsWith("HTTP/1.1 429"));
  EXPECT_THAT(refused, HasSubstr("--max-queue-wait-seconds"));
  EXPECT_THAT(metrics_.Serialize(),
              HasSubstr("kvserve_router_rejected_requests_total{reason=\"queue_timeout\"} 1"));
  worker_->Hold(false);
  for (auto& f : sent) EXPECT_THAT(f.get(), StartsWith("HTTP/1.1 200"));
}

TEST_F(AdmissionTest, ARequestPastItsDeadlineGets504AndIsAbortedOnItsWorker) {
  FrontOptions front = TinyFront();
  front.request_timeout = absl::Milliseconds(400);
  StartHolding(front);
  // The router's deadline, then a client's shorter one; both with the request on the worker.
  for (const std::string& headers : {std::string(), std::string("X-Request-Timeout: 0.2\r\n")}) {
    const int aborts = worker_->aborts();
    const std::string answer = PostRaw(front_->port(), "/v1/completions", kRequest, headers);
    EXPECT_THAT(answer, StartsWith("HTTP/1.1 504"));
    EXPECT_THAT(answer, HasSubstr("deadline"));
    EXPECT_TRUE(WaitFor([&] { return worker_->aborts() == aborts + 1; }));
  }
  // A client's deadline is no longer than the router's; a value that is no deadline is a 400.
  const std::string bad =
      PostRaw(front_->port(), "/v1/completions", kRequest, "X-Request-Timeout: soon\r\n");
  EXPECT_THAT(bad, StartsWith("HTTP/1.1 400"));
  EXPECT_THAT(bad, HasSubstr("X-Request-Timeout"));
  EXPECT_THAT(metrics_.Serialize(),
              HasSubstr("kvserve_router_rejected_requests_total{reason=\"deadline\"} 2"));
}

}  // namespace
}  // namespace kvserve::router
