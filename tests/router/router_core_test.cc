// RouterCore with real workers: a request sent to a worker that stops responding before
// anything streamed is moved to another worker and completes.
#include "router/router_core.h"

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <mutex>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "tests/testing/paths.h"
#include "tests/testing/status_matchers.h"
#include "tests/worker/server/worker_process.h"

namespace kvserve::router {
namespace {

namespace pb = ::kvserve::v1;
using kvserve::testing::WorkerProcess;

// Flags for a small kvserve-worker on the tiny Qwen3 fixture, plus `extra`.
std::vector<std::string> TinyWorkerArgs(std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"--model",         kvserve::testing::FixtureModel("tiny-qwen3"),
                                   "--max-model-len", "256",
                                   "--num-blocks",    "64"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

// Waits up to 5 s until the core sees `n` workers, all eligible.
bool WaitAllEligible(const RouterCore& core, size_t n) {
  for (int i = 0; i < 500; ++i) {
    const std::vector<WorkerInfo> w = core.Workers();
    if (w.size() == n &&
        std::all_of(w.begin(), w.end(), [](const WorkerInfo& x) { return x.eligible; }))
      return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// The test below, with the core on a thread of its own or (on_io) on an io_context's thread as
// kvserve-router --api-threads 0 runs it: the turns come from the workers' messages, the
// inbox and the periodic tick.
void RequestsMoveOffASilentWorker(bool on_io) {
  const std::vector<std::string> args = TinyWorkerArgs();
  ASSERT_OK_AND_ASSIGN(auto w0, WorkerProcess::Start(args));
  ASSERT_OK_AND_ASSIGN(auto w1, WorkerProcess::Start(args));
  RouterOptions o;
  o.workers = {{"w0", "127.0.0.1", w0->port(), w0->events_port()},
               {"w1", "127.0.0.1", w1->port(), w1->events_port()}};
  o.heartbeat_timeout = absl::Milliseconds(600);
  RouterCore core(o);
  boost::asio::io_context io{1};
  auto work = boost::asio::make_work_guard(io);
  std::thread io_thread;
  if (on_io) {
    io_thread = std::thread([&] { io.run(); });
    core.StartOn(io);
  } else {
    core.Start();
  }
  for (int i = 0; i < 200 && !core.ready(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // both heartbeats in

  // Freeze worker 0: it stays connected but answers nothing, like a hung process.
  ASSERT_EQ(kill(w0->pid(), SIGSTOP), 0);
  std::atomic<int> tokens{0};
  std::atomic<bool> done{false};
  std::atomic<int> errors{0};
  std::atomic<int> finished{0};
  for (int i = 0; i < 4; ++i) {  // whichever worker the policy picks, some land on worker 0
    auto job = std::make_shared<Job>();
    job->request = kvserve::testing::MakeRequest("r" + std::to_string(i), {1, 2, 3, 4, 5}, 3);
    job->session_key = "s" + std::to_string(i);
    job->on_response = [&](const pb::GenerateResponse& r) {
      tokens += r.token_ids_size();
      if (r.finish_reason() == pb::FINISH_REASON_ERROR) ++errors;
      if (r.has_usage() || r.finish_reason() == pb::FINISH_REASON_ERROR) {
        if (++finished == 4) done = true;
      }
    };
    core.Submit(job);
  }
  for (int i = 0; i < 1000 && !done; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  kill(w0->pid(), SIGCONT);
  EXPECT_TRUE(done);
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(tokens.load(), 12);
  EXPECT_GT(core.moved(), 0);
  if (on_io) {
    io.stop();
    io_thread.join();
  }
  core.Stop();
}

TEST(RouterCoreTest, NotYetStartedRequestsMoveOffASilentWorker) {
  RequestsMoveOffASilentWorker(/*on_io=*/false);
}

TEST(RouterCoreTest, OnAnIoContextsThreadRequestsMoveOffASilentWorker) {
  RequestsMoveOffASilentWorker(/*on_io=*/true);
}

// Router replicas act as one through the workers' load reports: a replica that placed nothing
// sees another's requests in its estimate (once, not twice in the placer's own), a replica
// started mid-run sees them too, and a replica that stops leaves no load behind (the worker gives
// up its requests).
TEST(RouterCoreTest, ReplicasSeeEachOthersPlacementsThroughLoadReports) {
  // Steps of 50 ms: a request of 200 tokens runs about 10 s, longer than any wait below.
  ASSERT_OK_AND_ASSIGN(
      auto w,
      WorkerProcess::Start(TinyWorkerArgs({"--device", "sim", "--sim-step-overhead-us", "50000"})));
  auto options = [&](const std::string& id) {
    RouterOptions o;
    o.workers = {{"w0", "127.0.0.1", w->port(), w->events_port()}};
    o.coordinator_id = id;
    return o;
  };
  auto a = std::make_unique<RouterCore>(options("replica-a"));
  RouterCore b(options("replica-b"));
  a->Start();
  b.Start();
  ASSERT_TRUE(WaitAllEligible(*a, 1));
  ASSERT_TRUE(WaitAllEligible(b, 1));
  std::atomic<int> errors{0};
  for (int i = 0; i < 3; ++i) {
    auto job = std::make_shared<Job>();
    job->request =
        kvserve::testing::MakeRequest(absl::StrCat("r", i), std::vector<int32_t>(20, 7 + i), 200);
    job->request.mutable_sampling()->set_ignore_eos(true);
    job->on_response = [&](const pb::GenerateResponse& r) {
      if (r.has_error()) ++errors;
    };
    a->Submit(job);
  }
  // Each request reserves ceil((20 + 200) / 16) blocks; all three prefilled, three decode rows.
  const int64_t want_blocks = 3 * ((20 + 200 + 15) / 16);
  auto sees_them = [&](const RouterCore& core) {
    for (int i = 0; i < 500; ++i) {
      const std::vector<WorkerInfo> info = core.Workers();
      if (info.size() == 1 && info[0].load_reported && info[0].load_blocks == want_blocks &&
          info[0].decode_seqs == 3 && info[0].prefill_tokens == 0) {
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    const WorkerInfo i = core.Workers().at(0);
    ADD_FAILURE() << "load_reported " << i.load_reported << ", load_blocks " << i.load_blocks
                  << ", decode_seqs " << i.decode_seqs << ", prefill_tokens " << i.prefill_tokens;
    return false;
  };
  EXPECT_TRUE(sees_them(b));   // placed nothing itself
  EXPECT_TRUE(sees_them(*a));  // its own, counted once
  EXPECT_EQ(b.Workers().at(0).inflight_requests, 0);
  RouterCore c(options("replica-c"));  // started mid-run
  c.Start();
  ASSERT_TRUE(WaitAllEligible(c, 1));
  EXPECT_TRUE(sees_them(c));
  EXPECT_EQ(errors.load(), 0);

  a->Stop();  // its requests' replies have nowhere to go: the worker aborts them
  a.reset();
  auto empty = [&](const RouterCore& core) {
    for (int i = 0; i < 500; ++i) {
      const WorkerInfo info = core.Workers().at(0);
      if (info.load_blocks == 0 && info.decode_seqs == 0) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  };
  EXPECT_TRUE(empty(b));
  EXPECT_TRUE(empty(c));
  b.Stop();
  c.Stop();
}

TEST(RouterCoreTest, DnsDiscoveryAddsAndRemovesWorkers) {
  // Two workers on the same ports at two loopback addresses, as pods behind a headless Service.
  const int port = kvserve::testing::FreePort(), events = kvserve::testing::FreePort();
  auto args = [&](const char* host) {
    return TinyWorkerArgs(
        {"--host", host, "--port", std::to_string(port), "--events-port", std::to_string(events)});
  };
  ASSERT_OK_AND_ASSIGN(auto a, WorkerProcess::Start(args("127.0.0.1")));
  ASSERT_OK_AND_ASSIGN(auto b, WorkerProcess::Start(args("127.0.0.2")));
  std::mutex mu;
  std::vector<std::string> addresses = {"127.0.0.1"};
  RouterOptions o;
  o.workers_dns = DnsTarget{"kvserve-workers", port, events};
  o.dns_refresh = absl::Milliseconds(50);
  o.dns_resolver = [&](const std::string&) -> absl::StatusOr<std::vector<std::string>> {
    std::lock_guard<std::mutex> lock(mu);
    return addresses;
  };
  o.heartbeat_timeout = absl::Seconds(1);
  RouterCore core(o);
  core.Start();
  auto eligible = [&] {
    std::vector<std::string> names;
    for (const WorkerInfo& w : core.Workers()) {
      if (w.eligible) names.push_back(w.name);
    }
    std::sort(names.begin(), names.end());
    return names;
  };
  auto wait_for = [&](const std::vector<std::string>& want) {
    for (int i = 0; i < 500 && eligible() != want; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return eligible();
  };
  const std::string na = absl::StrCat("127.0.0.1:", port, ":", events);
  const std::string nb = absl::StrCat("127.0.0.2:", port, ":", events);
  EXPECT_EQ(wait_for({na}), std::vector<std::string>{na});
  {
    std::lock_guard<std::mutex> lock(mu);
    addresses = {"127.0.0.1", "127.0.0.2"};  // scaled up
  }
  EXPECT_EQ(wait_for({na, nb}), (std::vector<std::string>{na, nb}));
  {
    std::lock_guard<std::mutex> lock(mu);
    addresses = {"127.0.0.2"};  // the first pod went away
  }
  EXPECT_EQ(wait_for({nb}), std::vector<std::string>{nb});
  // Requests go to the remaining worker and complete.
  std::atomic<int> tokens{0}, finished{0};
  for (int i = 0; i < 3; ++i) {
    auto job = std::make_shared<Job>();
    job->request = kvserve::testing::MakeRequest("d" + std::to_string(i), {1, 2, 3, 4}, 2);
    job->on_response = [&](const pb::GenerateResponse& r) {
      EXPECT_NE(r.finish_reason(), pb::FINISH_REASON_ERROR) << r.error().message();
      tokens += r.token_ids_size();
      if (r.has_usage()) ++finished;
    };
    core.Submit(job);
  }
  for (int i = 0; i < 1000 && finished < 3; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(finished.load(), 3);
  EXPECT_EQ(tokens.load(), 6);
  core.Stop();
}

TEST(RouterCoreTest, ConcurrentGrantsFromTwoReplicasTakeOneWorkerDown) {
  // Two other router replicas (played by this test) grant a recycle slot to both workers within
  // each other's hold; with --max-unavailable 1 this replica revokes one of the held grants
  // (the later one), so exactly one worker recycles and the other returns to service.
  const std::vector<std::string> args = TinyWorkerArgs({"--recycle-grant-hold-ms", "1000"});
  ASSERT_OK_AND_ASSIGN(auto w0, WorkerProcess::Start(args));
  ASSERT_OK_AND_ASSIGN(auto w1, WorkerProcess::Start(args));
  RouterOptions o;
  o.workers = {{"w0", "127.0.0.1", w0->port(), w0->events_port()},
               {"w1", "127.0.0.1", w1->port(), w1->events_port()}};
  o.max_unavailable = 1;
  o.coordinator_id = "replica-c";
  o.heartbeat_timeout = absl::Seconds(1);
  RouterCore core(o);
  core.Start();
  ASSERT_TRUE(WaitAllEligible(core, 2));
  const uint64_t i0 = w0->instance_id(), i1 = w1->instance_id();
  zmq::context_t ctx;
  kvserve::testing::Client c0(ctx, w0->port()), c1(ctx, w1->port());
  auto grant = [](uint64_t instance, const char* replica) {
    pb::Control g;
    g.set_action(pb::CONTROL_ACTION_RECYCLE_GRANT);
    g.set_instance_id(instance);
    g.set_reason("requests");
    g.set_coordinator_id(replica);
    return g;
  };
  ASSERT_OK(c0.Send(grant(i0, "replica-a")));
  // w1's grant only once w0 holds its own (out of rotation here): "later" is the time each
  // worker took its grant, and a busy machine may delay w0's process past a fixed gap.
  const auto w0_down = [&] {
    for (const WorkerInfo& w : core.Workers()) {
      if (w.name == "w0") return !w.eligible;
    }
    return false;
  };
  for (int i = 0; i < 500 && !w0_down(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ASSERT_TRUE(w0_down()) << "w0 did not take its grant";
  ASSERT_OK(c1.Send(grant(i1, "replica-b")));
  // w1 (the later grant) is revoked and back in rotation well before its hold would end;
  // w0 commits and comes back as a new instance.
  bool w1_back = false;
  for (int i = 0; i < 300 && !w1_back; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    for (const WorkerInfo& w : core.Workers()) {
      if (w.name == "w1" && w.eligible && w.instance_id == i1 && core.revokes() > 0) w1_back = true;
    }
  }
  EXPECT_TRUE(w1_back);
  EXPECT_EQ(core.revokes(), 1);
  ASSERT_OK_AND_ASSIGN(uint64_t n0, w0->WaitForNewInstance(i0, 60));
  EXPECT_NE(n0, i0);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // past w1's hold
  ASSERT_OK_AND_ASSIGN(uint64_t n1, w1->WaitForNewInstance(0, 5));
  EXPECT_EQ(n1, i1) << "the revoked worker must not have recycled";
  core.Stop();
}

// The sum of a worker's kvserve_recycles_total series, once it serves again.
double RecyclesCounted(WorkerProcess& w) {
  double total = 0;
  for (int i = 0; i < 300; ++i) {
    absl::StatusOr<std::pair<int, std::string>> ready =
        kvserve::testing::HttpGet(w.metrics_port(), "/ready");
    if (ready.ok() && ready->first == 200) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  absl::StatusOr<std::pair<int, std::string>> m =
      kvserve::testing::HttpGet(w.metrics_port(), "/metrics");
  if (!m.ok()) return 0;
  for (absl::string_view line : absl::StrSplit(m->second, '\n')) {
    double v = 0;
    if (absl::StartsWith(line, "kvserve_recycles_total{") &&
        absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &v)) {
      total += v;
    }
  }
  return total;
}

TEST(RouterCoreTest, CoordinatorRecyclesOneWorkerAtATimeUnderLoad) {
  const std::vector<std::string> args = TinyWorkerArgs({"--recycle-after-requests", "4"});
  ASSERT_OK_AND_ASSIGN(auto w0, WorkerProcess::Start(args));
  ASSERT_OK_AND_ASSIGN(auto w1, WorkerProcess::Start(args));
  RouterOptions o;
  o.workers = {{"w0", "127.0.0.1", w0->port(), w0->events_port()},
               {"w1", "127.0.0.1", w1->port(), w1->events_port()}};
  o.max_unavailable = 1;
  o.heartbeat_timeout = absl::Seconds(1);
  RouterCore core(o);
  core.Start();
  ASSERT_TRUE(WaitAllEligible(core, 2));
  int completed = 0, failed = 0, max_unavailable_seen = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  int i = 0;
  while ((core.grants() < 4 || completed < 20) && std::chrono::steady_clock::now() < deadline) {
    std::atomic<int> result{0};  // 1 ok, -1 failed
    auto job = std::make_shared<Job>();
    job->request = kvserve::testing::MakeRequest("load" + std::to_string(i++), {7, 8, 9, 10}, 3);
    job->on_response = [&](const pb::GenerateResponse& r) {
      if (r.finish_reason() == pb::FINISH_REASON_ERROR) {
        ADD_FAILURE() << "request failed: " << r.error().message();
        result = -1;
      } else if (r.has_usage())
        result = 1;
    };
    core.Submit(job);
    while (result == 0) {
      int unavailable = 0;
      for (const WorkerInfo& w : core.Workers()) {
        unavailable += w.state == "WORKER_STATE_DRAINING" || w.state == "WORKER_STATE_RECYCLING";
      }
      max_unavailable_seen = std::max(max_unavailable_seen, unavailable);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    if (result == 1)
      ++completed;
    else if (result == -1) {
      // No worker ready right now (one recycling, the other mid-request is fine): a client
      // would retry; count it and retry after a moment.
      ++failed;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  core.Stop();
  EXPECT_GE(core.grants(), 4);
  EXPECT_GE(completed, 20);
  EXPECT_EQ(failed, 0);
  EXPECT_LE(max_unavailable_seen, 1);
  // kvserve_recycles_total survives the re-execs: the recycled processes' counts add up.
  EXPECT_GE(RecyclesCounted(*w0) + RecyclesCounted(*w1), 2);
}

}  // namespace
}  // namespace kvserve::router
