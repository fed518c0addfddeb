// Helpers of the KV transfer's end-to-end tests (kv_fetch_test, kv_link_test): a greedy
// request through a RouterCore to its end, a metric read from Prometheus text, the test prompt,
// and a wait for the workers to be ready.
#ifndef KVSERVE_TESTS_ROUTER_KV_TRANSFER_TESTING_H_
#define KVSERVE_TESTS_ROUTER_KV_TRANSFER_TESTING_H_

#include <algorithm>
#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "router/router_core.h"
#include "tests/worker/server/worker_process.h"

namespace kvserve::router {

namespace pb = ::kvserve::v1;

struct Answer {
  std::vector<int> tokens;
  int cached = -1;
  std::string error;
};

// The value of the first series in `text` that starts with `series` (its name and its first
// labels as exposed, or its whole name); -1 when absent.
inline double Metric(const std::string& text, const std::string& series) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::StartsWith(line, series)) continue;
    const absl::string_view rest = line.substr(series.size());
    if (rest.empty()) continue;
    const bool labels_follow = rest[0] == '{' && series.find('{') == std::string::npos;
    if (rest[0] != ' ' && rest[0] != ',' && rest[0] != '}' && !labels_follow) {
      continue;
    }
    double v = -1;
    if (absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &v)) return v;
  }
  return -1;
}

// Runs a greedy request of `prompt` through `core` to its end (60 s at most: a hang fails the
// test); `on_first` runs at its first token.
inline Answer RunOn(RouterCore& core, const std::string& id, const std::vector<int32_t>& prompt,
                    int max_tokens = 8, const std::function<void()>& on_first = nullptr) {
  auto answer = std::make_shared<Answer>();
  auto done = std::make_shared<std::promise<void>>();
  auto job = std::make_shared<Job>();
  job->request = kvserve::testing::MakeRequest(id, prompt, max_tokens);
  job->on_response = [answer, done, on_first](const pb::GenerateResponse& r) {
    if (answer->tokens.empty() && r.token_ids_size() > 0 && on_first) on_first();
    answer->tokens.insert(answer->tokens.end(), r.token_ids().begin(), r.token_ids().end());
    if (r.finish_reason() == pb::FINISH_REASON_ERROR) {
      answer->error = r.error().message();
      done->set_value();
    } else if (r.has_usage()) {
      answer->cached = r.usage().cached_prompt_tokens();
      done->set_value();
    }
  };
  std::future<void> finished = done->get_future();
  core.Submit(job);
  EXPECT_EQ(finished.wait_for(std::chrono::seconds(60)), std::future_status::ready)
      << "request " << id << " hangs";
  return *answer;
}

// 170 tokens: ten full blocks of 16 and a partial one. `seed` makes another prompt.
inline std::vector<int32_t> Prompt(int seed) {
  std::vector<int32_t> p;
  for (int i = 0; i < 170; ++i) p.push_back(10 + (i * 7919 + seed * 104729) % 900);
  return p;
}
constexpr int kFullBlockTokens = 160;

// Waits until `core` sees `n` workers READY with their pools known.
inline void WaitReady(const RouterCore& core, size_t n) {
  for (int i = 0; i < 3000; ++i) {
    const std::vector<WorkerInfo> w = core.Workers();
    if (w.size() == n && std::all_of(w.begin(), w.end(), [](const WorkerInfo& x) {
          return x.state == "WORKER_STATE_READY" && x.device_blocks_total > 0;
        })) {
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  FAIL() << "workers never ready";
}

// The heartbeat timeout of cores in front of workers whose steps can take seconds (the emulated
// CUDA device on a loaded CI machine): a worker heartbeats between steps, and the default 2 s
// marked a busy worker unhealthy under its first request.
inline constexpr absl::Duration kSlowStepHeartbeatTimeout = absl::Seconds(10);

// `prompt`'s greedy answer from `worker` alone behind a core of its own: the aggregated
// reference a transfer's answer must equal.
inline Answer RunAlone(const kvserve::testing::WorkerProcess& worker,
                       const std::vector<int32_t>& prompt) {
  RouterOptions o;
  o.workers = {{"alone", "127.0.0.1", worker.port(), worker.events_port()}};
  o.heartbeat_timeout = kSlowStepHeartbeatTimeout;
  RouterCore alone(o);
  alone.Start();
  WaitReady(alone, 1);
  Answer want = RunOn(alone, "want", prompt);
  alone.Stop();
  return want;
}

}  // namespace kvserve::router

#endif  // KVSERVE_TESTS_ROUTER_KV_TRANSFER_TESTING_H_
