// kvserve-worker as a process, driven over ZeroMQ by scripted clients (no router): streamed
// outputs equal the in-process engine's, KV events rebuild the cached-block set (with a
// snapshot resync after a dropped batch), /metrics lints and agrees with the engine, malformed
// traffic never stops it, SIGTERM drains, and planned recycles under load lose nothing.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <random>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "tests/testing/paths.h"
#include "tests/testing/status_matchers.h"
#include "tests/worker/engine_test_util.h"
#include "tests/worker/server/worker_process.h"

namespace kvserve::testing {
namespace {

namespace pb = ::kvserve::v1;

std::vector<std::string> ModelArgs(const std::string& model) {
  return {"--model", FixtureModel(model), "--max-model-len", "256", "--num-blocks", "256"};
}

// Sends requests and waits for every sample to finish; returns tokens per request id.
std::map<std::string, std::vector<int32_t>> RunRequests(
    Client& c, const std::vector<pb::GenerateRequest>& reqs,
    std::vector<std::string>* errors = nullptr) {
  for (const auto& r : reqs) EXPECT_OK(c.Send(r));
  std::map<std::string, std::vector<int32_t>> out;
  size_t finished = 0;
  while (finished < reqs.size()) {
    std::optional<ReceivedMessage> m = c.Receive(20000);
    if (!m) {
      ADD_FAILURE() << "timed out waiting for responses";
      break;
    }
    pb::GenerateResponse r;
    if (!ParseMessage(*m, &r).ok()) continue;
    auto& tokens = out[r.request_id()];
    tokens.insert(tokens.end(), r.token_ids().begin(), r.token_ids().end());
    if (r.finish_reason() == pb::FINISH_REASON_ERROR ||
        r.finish_reason() == pb::FINISH_REASON_ABORT) {
      if (errors != nullptr)
        errors->push_back(absl::StrCat(r.request_id(), ": ", r.error().message()));
      ++finished;
    } else if (r.has_usage()) {
      ++finished;
    }
  }
  return out;
}

double MetricValue(const std::string& text, const std::string& prefix) {
  const size_t at = text.find("\n" + prefix);
  if (at == std::string::npos) return -1;
  const size_t sp = text.find(' ', at + 1 + prefix.size());
  return std::stod(text.substr(sp + 1, text.find('\n', sp) - sp - 1));
}

TEST(WorkerServerTest, StreamsTheSameTokensAsTheInProcessEngine) {
  ASSERT_OK_AND_ASSIGN(auto w, WorkerProcess::Start(ModelArgs("tiny-llama3")));
  zmq::context_t ctx;
  Client c(ctx, w->port());
  std::mt19937 rng(3);
  std::vector<pb::GenerateRequest> reqs;
  for (int i = 0; i < 6; ++i) {
    std::vector<int32_t> prompt(5 + rng() % 60);
    for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % 1024);
    reqs.push_back(MakeRequest("r" + std::to_string(i), prompt, 12, /*stream=*/i % 2 == 0));
  }
  auto got = RunRequests(c, reqs);

  worker::EngineConfig config = worker::testing::FixtureConfig("tiny-llama3", 256);
  config.max_model_len = 256;
  auto engine = worker::testing::MakeEngine(config);
  for (const auto& r : reqs) {
    worker::RequestInput in = worker::testing::GreedyRequest(
        r.request_id(), {r.prompt_token_ids().begin(), r.prompt_token_ids().end()}, r.max_tokens());
    ASSERT_OK(engine->AddRequest(in));
  }
  auto want = worker::testing::RunToCompletion(*engine);
  for (const auto& r : reqs) {
    auto [agreed, near_tie] =
        worker::testing::GreedyAgreement(want[r.request_id()][0], got[r.request_id()]);
    EXPECT_TRUE(agreed == 12 || near_tie) << r.request_id() << " diverges at " << agreed;
    EXPECT_EQ(got[r.request_id()].size(), 12u);
  }
  // Bad requests get error replies naming the problem.
  std::vector<std::string> errors;
  RunRequests(
      c,
      {MakeRequest("bad", {5, 99999}, 4), MakeRequest("empty", {}, 4), MakeRequest("zero", {1}, 0)},
      &errors);
  ASSERT_EQ(errors.size(), 3u);
  EXPECT_EQ(w->Terminate(), 0);
}

// A KV-event subscriber that rebuilds a worker's cached-block set the way the router's prefix
// index does: batches applied in sequence; on a gap, a snapshot is asked for, batches are
// buffered until it arrives, then it replaces the set and the buffered newer batches apply.
// Batch 40 is dropped on purpose, to force one resync.
class KvEventFollower {
 public:
  KvEventFollower(zmq::context_t& ctx, int events_port, Client* control)
      : sub_(ctx, zmq::socket_type::sub), control_(control) {
    sub_.set(zmq::sockopt::subscribe, "kv");
    sub_.set(zmq::sockopt::rcvhwm, 0);
    sub_.connect(absl::StrCat("tcp://127.0.0.1:", events_port));
  }

  // Handles what arrives until `timeout_ms` passes with nothing.
  void Pump(int timeout_ms) {
    while (true) {
      zmq::pollitem_t items[] = {{sub_.handle(), 0, ZMQ_POLLIN, 0}};
      zmq::poll(items, 1, std::chrono::milliseconds(timeout_ms));
      if (!(items[0].revents & ZMQ_POLLIN)) return;
      auto m = ReceiveMessage(sub_, true, zmq::recv_flags::dontwait);
      if (!m.ok() || !m->has_value()) return;
      if ((*m)->type == "KvSnapshot") {
        pb::KvSnapshot snap;
        ASSERT_OK(ParseMessage(**m, &snap));
        OnSnapshot(snap);
      } else {
        pb::KvEventBatch b;
        ASSERT_OK(ParseMessage(**m, &b));
        OnBatch(b);
      }
    }
  }

  void RequestSnapshot() {
    pb::Control ask;
    ask.set_action(pb::CONTROL_ACTION_SNAPSHOT_REQUEST);
    ASSERT_OK(control_->Send(ask));
  }

  std::set<std::pair<std::string, int>> cached;  // (hash bytes, medium)
  uint64_t last_seq = 0;
  bool resyncing = false;
  int gaps = 0;
  std::optional<pb::KvSnapshot> last_snapshot;

 private:
  void Apply(const pb::KvEventBatch& b) {
    for (const pb::KvEvent& e : b.events()) {
      if (e.has_stored()) {
        for (const auto& h : e.stored().block_hashes()) cached.insert({h, e.stored().medium()});
      } else if (e.has_removed()) {
        for (const auto& h : e.removed().block_hashes()) cached.erase({h, e.removed().medium()});
      } else if (e.has_all_cleared()) {
        cached.clear();
      }
    }
    last_seq = b.seq();
  }

  void OnSnapshot(const pb::KvSnapshot& snap) {
    last_snapshot = snap;
    if (!resyncing) return;
    cached.clear();
    for (const auto& b : snap.blocks()) cached.insert({b.block_hash(), b.medium()});
    last_seq = snap.seq();
    for (const auto& b : buffered_) {
      if (b.seq() > last_seq) Apply(b);
    }
    buffered_.clear();
    resyncing = false;
  }

  void OnBatch(const pb::KvEventBatch& b) {
    if (++batches_ == 40 && !dropped_) {  // deliberately lose one batch
      dropped_ = true;
      return;
    }
    if (resyncing) {
      buffered_.push_back(b);
      return;
    }
    if (b.seq() != last_seq + 1) {  // a lost batch, or joined after the first one
      ++gaps;
      resyncing = true;
      buffered_.push_back(b);
      RequestSnapshot();
      return;
    }
    Apply(b);
  }

  zmq::socket_t sub_;
  Client* control_;
  std::vector<pb::KvEventBatch> buffered_;
  int batches_ = 0;
  bool dropped_ = false;
};

// 5,000 requests in waves of 50 (half of them sharing a prefix), three of each wave aborted,
// each wave answered before the next, the follower pumped meanwhile. Returns the aborts seen.
int SendWaves(Client& c, KvEventFollower& follower) {
  std::mt19937 rng(11);
  std::vector<int32_t> shared(40);
  for (int32_t& t : shared) t = static_cast<int32_t>(rng() % 1024);
  int sent = 0, aborted = 0;
  while (sent < 5000) {
    std::vector<pb::GenerateRequest> wave;
    for (int i = 0; i < 50 && sent < 5000; ++i, ++sent) {
      std::vector<int32_t> prompt;
      if (rng() % 2) prompt.assign(shared.begin(), shared.begin() + 8 + rng() % 32);
      const int extra = 1 + rng() % 40;
      for (int k = 0; k < extra; ++k) prompt.push_back(static_cast<int32_t>(rng() % 1024));
      wave.push_back(MakeRequest("q" + std::to_string(sent), prompt, 1 + rng() % 6));
    }
    for (const auto& r : wave) EXPECT_OK(c.Send(r));
    for (int i = 0; i < 3; ++i) {
      pb::AbortRequest a;
      a.set_request_id(wave[rng() % wave.size()].request_id());
      EXPECT_OK(c.Send(a));
    }
    std::set<std::string> finished;
    while (finished.size() < wave.size()) {
      follower.Pump(0);
      std::optional<ReceivedMessage> m = c.Receive(10000);
      EXPECT_TRUE(m.has_value()) << "no response; " << finished.size() << " of " << wave.size();
      if (!m.has_value()) return aborted;
      pb::GenerateResponse r;
      if (!ParseMessage(*m, &r).ok()) continue;
      if (r.finish_reason() == pb::FINISH_REASON_ABORT) ++aborted;
      if (r.has_usage() || r.finish_reason() == pb::FINISH_REASON_ABORT ||
          r.finish_reason() == pb::FINISH_REASON_ERROR) {
        finished.insert(r.request_id());
      }
    }
  }
  return aborted;
}

TEST(WorkerServerTest, KvEventsRebuildTheCachedSetWithSnapshotResync) {
  std::vector<std::string> args = {"--model",
                                   FixtureModel("tiny-qwen3"),
                                   "--max-model-len",
                                   "128",
                                   "--num-blocks",
                                   "64",
                                   "--block-size",
                                   "8",
                                   "--swap-space",
                                   "0.0001",
                                   "--preemption-mode",
                                   "swap",
                                   "--host-prefix-cache",
                                   "--max-num-seqs",
                                   "16"};
  ASSERT_OK_AND_ASSIGN(auto w, WorkerProcess::Start(args));
  zmq::context_t ctx;
  Client c(ctx, w->port());
  Client control(ctx, w->port());
  KvEventFollower follower(ctx, w->events_port(), &control);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // let SUB join before traffic
  const int aborted = SendWaves(c, follower);
  ASSERT_FALSE(HasFailure());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  follower.Pump(100);
  ASSERT_FALSE(follower.resyncing);
  // Quiescent: the worker's actual set, as a snapshot, equals what the events rebuilt.
  follower.last_snapshot.reset();
  follower.RequestSnapshot();
  for (int i = 0; i < 50 && !follower.last_snapshot; ++i) follower.Pump(100);
  ASSERT_TRUE(follower.last_snapshot.has_value());
  std::set<std::pair<std::string, int>> actual;
  for (const auto& b : follower.last_snapshot->blocks()) {
    actual.insert({b.block_hash(), b.medium()});
  }
  EXPECT_EQ(follower.last_snapshot->seq(), follower.last_seq);
  EXPECT_EQ(follower.cached, actual);
  EXPECT_GT(actual.size(), 0u);
  EXPECT_GE(follower.gaps, 1);  // the dropped batch (a slow subscriber could see more)
  EXPECT_GT(aborted, 0);
  auto metrics = HttpGet(w->metrics_port(), "/metrics");
  ASSERT_OK(metrics.status());
  EXPECT_GT(MetricValue(metrics->second, "kvserve_swap_blocks_total{direction=\"out\""), 0)
      << "no swaps happened";
  EXPECT_GT(MetricValue(metrics->second, "kvserve_kv_evictions_total{"), 0);
  EXPECT_EQ(MetricValue(metrics->second,
                        "vllm:request_success_total{finished_reason=\"abort\",model_name="),
            aborted);
  int host_events = 0;
  for (const auto& [h, medium] : actual) host_events += medium == pb::MEDIUM_HOST;
  RecordProperty("host_blocks_cached", host_events);
  EXPECT_EQ(w->Terminate(), 0);
}

// Runs promtool check metrics on text; returns its exit code and output.
std::pair<int, std::string> Promtool(const std::string& text) {
  const std::string path = MakeTempDir() + "/metrics.txt";
  FILE* f = fopen(path.c_str(), "w");
  fwrite(text.data(), 1, text.size(), f);
  fclose(f);
  FILE* p = popen(("promtool check metrics < " + path + " 2>&1").c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int rc = pclose(p);
  return {WEXITSTATUS(rc), out};
}

// A worker that answers /ready already publishes the series autoscalers and endpoint pickers
// read (at their start values), not a heartbeat later.
TEST(WorkerServerTest, MetricsExistWhenReady) {
  std::vector<std::string> args = ModelArgs("tiny-qwen2");
  args.insert(args.end(), {"--heartbeat-ms", "60000", "--recycle-grant-hold-ms", "180000"});
  ASSERT_OK_AND_ASSIGN(auto w, WorkerProcess::Start(args));
  // The ports file is written just before the loop starts and turns /ready to 200.
  std::pair<int, std::string> ready;
  for (int i = 0; i < 500 && ready.first != 200; ++i) {
    ASSERT_OK_AND_ASSIGN(ready, HttpGet(w->metrics_port(), "/ready"));
    if (ready.first != 200) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(ready.first, 200);
  ASSERT_OK_AND_ASSIGN(auto metrics, HttpGet(w->metrics_port(), "/metrics"));
  const std::string model = "{model_name=\"tiny-qwen2\",worker=";
  for (const char* name :
       {"vllm:kv_cache_usage_perc", "vllm:num_requests_running", "vllm:num_requests_waiting",
        "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total",
        "vllm:num_preemptions_total", "vllm:request_prompt_tokens_count",
        "vllm:iteration_tokens_total_count", "vllm:request_prefill_time_seconds_count"}) {
    EXPECT_GE(MetricValue(metrics.second, std::string(name) + model), 0) << name << " absent";
  }
  // (The counters count the start-up warm-up request; nothing is running or waiting.)
  EXPECT_EQ(MetricValue(metrics.second, "vllm:num_requests_running" + model), 0);
  EXPECT_EQ(MetricValue(metrics.second, "vllm:num_requests_waiting" + model), 0);
}

TEST(WorkerServerTest, MetricsLintAndAgreeWithTheEngine) {
  for (bool vllm : {false, true}) {
    std::vector<std::string> args = ModelArgs("tiny-qwen2");
    args.push_back(vllm ? "--vllm-metric-names=true" : "--vllm-metric-names=false");
    // No heartbeat during the test: what the scrapes show was refreshed by the requests.
    args.insert(args.end(), {"--heartbeat-ms", "60000", "--recycle-grant-hold-ms", "180000"});
    ASSERT_OK_AND_ASSIGN(auto w, WorkerProcess::Start(args));
    zmq::context_t ctx;
    Client c(ctx, w->port());
    std::vector<pb::GenerateRequest> reqs;
    int prompt_tokens = 0;
    for (int i = 0; i < 5; ++i) {
      std::vector<int32_t> prompt(10 + i, static_cast<int32_t>(100 + i));
      prompt_tokens += static_cast<int>(prompt.size());
      reqs.push_back(MakeRequest("m" + std::to_string(i), prompt, 7));
    }
    auto got = RunRequests(c, reqs);
    // Metrics refresh when a request finishes, before its reply: a scrape right after the last
    // answer agrees with what was served (no wait for a heartbeat).
    ASSERT_OK_AND_ASSIGN(auto metrics, HttpGet(w->metrics_port(), "/metrics"));
    EXPECT_EQ(metrics.first, 200);
    auto [rc, out] = Promtool(metrics.second);
    if (vllm) {
      // The only findings are vLLM's colon names, which dashboards need as they are, and its
      // histogram vllm:iteration_tokens_total, named so in vLLM.
      for (const std::string& line : std::vector<std::string>(absl::StrSplit(out, '\n'))) {
        if (line.empty()) continue;
        EXPECT_TRUE((line.rfind("vllm:", 0) == 0 &&
                     line.find("should not contain ':'") != std::string::npos) ||
                    line ==
                        "vllm:iteration_tokens_total non-counter metrics should not have "
                        "\"_total\" suffix")
            << line;
      }
      // vLLM's names, with vLLM's model_name label: what its dashboards and autoscalers query.
      const std::string model = "{model_name=\"tiny-qwen2\",worker=";
      EXPECT_EQ(MetricValue(metrics.second, "vllm:num_requests_running" + model), 0);
      EXPECT_EQ(MetricValue(metrics.second, "vllm:generation_tokens_total" + model), 5 * 7 + 1);
      EXPECT_EQ(MetricValue(metrics.second, "vllm:prompt_tokens_total" + model), prompt_tokens + 1);
      EXPECT_EQ(MetricValue(metrics.second,
                            "vllm:request_success_total{finished_reason=\"length\","
                            "model_name=\"tiny-qwen2\",worker="),
                5);
      for (const char* h :
           {"vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds",
            "vllm:request_queue_time_seconds", "vllm:time_per_output_token_seconds"}) {
        EXPECT_EQ(MetricValue(metrics.second, std::string(h) + "_count" + model), 5) << h;
      }
      EXPECT_EQ(MetricValue(metrics.second, "vllm:inter_token_latency_seconds_count" + model),
                5 * 6);
      // vLLM's per-request histograms: sizes, parameters, phase times, tokens per step.
      for (const char* h :
           {"vllm:request_prompt_tokens", "vllm:request_generation_tokens", "vllm:request_params_n",
            "vllm:request_params_max_tokens", "vllm:request_prefill_time_seconds",
            "vllm:request_decode_time_seconds", "vllm:request_inference_time_seconds"}) {
        EXPECT_EQ(MetricValue(metrics.second, std::string(h) + "_count" + model), 5) << h;
      }
      EXPECT_EQ(MetricValue(metrics.second, "vllm:request_prompt_tokens_sum" + model),
                prompt_tokens);
      EXPECT_EQ(MetricValue(metrics.second, "vllm:request_generation_tokens_sum" + model), 5 * 7);
      EXPECT_EQ(MetricValue(metrics.second, "vllm:request_params_max_tokens_sum" + model), 5 * 7);
      EXPECT_EQ(MetricValue(metrics.second, "vllm:request_params_n_sum" + model), 5);
      // Each step's tokens as vLLM counts them (its test_metrics: 10 requests of 9 prompt and 10
      // output tokens sum to 190): the prompt tokens computed and the tokens generated.
      EXPECT_EQ(MetricValue(metrics.second, "vllm:iteration_tokens_total_sum" + model),
                prompt_tokens + 5 * 7);
    } else {
      EXPECT_EQ(metrics.second.find("vllm:"), std::string::npos);
      EXPECT_EQ(rc, 0) << out;
    }
    // Counters agree with what was served (1 warm-up prompt token + 1 warm-up token included).
    EXPECT_EQ(MetricValue(metrics.second, "kvserve_generation_tokens_total{"), 5 * 7 + 1);
    EXPECT_EQ(MetricValue(metrics.second, "kvserve_prompt_tokens_total{"), prompt_tokens + 1);
    EXPECT_EQ(MetricValue(metrics.second, "kvserve_requests{state=\"running\""), 0);
    EXPECT_EQ(MetricValue(metrics.second,
                          "kvserve_requests_finished_total{finished_reason=\"length\",worker="),
              5);
    // Reasons that did not happen are there at 0 (so that rates over them are 0, not absent),
    // as are the recycle reasons.
    EXPECT_EQ(MetricValue(metrics.second,
                          "kvserve_requests_finished_total{finished_reason=\"abort\",worker="),
              0);
    EXPECT_EQ(MetricValue(metrics.second, "kvserve_recycles_total{reason=\"uptime\",worker="), 0);
    // At least one step per generated token (the CPU backend replays no graphs).
    EXPECT_GE(MetricValue(metrics.second, "kvserve_engine_steps_total{graph=\"none\""), 7 + 1);
    EXPECT_EQ(MetricValue(metrics.second, "kvserve_engine_steps_total{graph=\"replayed\""), 0);
    auto ready = HttpGet(w->metrics_port(), "/ready");
    EXPECT_EQ(ready->first, 200);
    EXPECT_EQ(w->Terminate(), 0);
  }
}

TEST(WorkerServerTest, MalformedTrafficNeverStopsServing) {
  ASSERT_OK_AND_ASSIGN(auto w, WorkerProcess::Start(ModelArgs("tiny-qwen3")));
  zmq::context_t ctx;
  Client good(ctx, w->port());
  zmq::socket_t bad(ctx, zmq::socket_type::dealer);
  bad.set(zmq::sockopt::linger, 0);
  bad.connect(absl::StrCat("tcp://127.0.0.1:", w->port()));
  std::mt19937 rng(99);
  const std::vector<std::string> types = {"GenerateRequest", "AbortRequest", "Control",
                                          "KvSnapshot",      "??",           ""};
  int served = 0;
  for (int i = 0; i < 3000; ++i) {
    std::vector<std::string> frames(1 + rng() % 4);
    for (std::string& f : frames) {
      if (rng() % 2)
        f = types[rng() % types.size()];
      else {
        f.resize(rng() % 64);
        for (char& ch : f) ch = static_cast<char>(rng());
      }
    }
    std::vector<std::string_view> views(frames.begin(), frames.end());
    ASSERT_OK(SendFrames(bad, views));
    if (i % 300 == 0) {
      auto got = RunRequests(good, {MakeRequest("ok" + std::to_string(i), {1, 2, 3, 4}, 3)});
      served += got["ok" + std::to_string(i)].size() == 3;
      // Garbage on the HTTP port too.
      int fd = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(static_cast<uint16_t>(w->metrics_port()));
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
        std::string junk(200, '\0');
        for (char& ch : junk) ch = static_cast<char>(rng());
        (void)!write(fd, junk.data(), junk.size());
      }
      close(fd);
    }
  }
  EXPECT_EQ(served, 10);
  ASSERT_OK_AND_ASSIGN(auto health, HttpGet(w->metrics_port(), "/health"));
  EXPECT_EQ(health.first, 200);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ASSERT_OK_AND_ASSIGN(auto metrics, HttpGet(w->metrics_port(), "/metrics"));
  EXPECT_NE(metrics.second.find("kvserve_dropped_messages_total"), std::string::npos);
  EXPECT_TRUE(w->Alive());
  EXPECT_EQ(w->Terminate(), 0);
}

// Issue 26: one silent connection used to freeze /health, /ready and /metrics (the server read
// synchronously, with no deadline), and a liveness probe would then restart a healthy worker.
TEST(WorkerServerTest, IdleAndSlowClientsNeverHoldUpProbes) {
  ASSERT_OK_AND_ASSIGN(auto w, WorkerProcess::Start(ModelArgs("tiny-llama3")));
  // The ports file comes just before the serving loop marks the worker READY.
  for (int i = 0; i < 500; ++i) {
    absl::StatusOr<std::pair<int, std::string>> ready = HttpGet(w->metrics_port(), "/ready");
    if (ready.ok() && ready->first == 200) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::vector<int> held;
  for (int i = 0; i < 100; ++i) {  // more than the server keeps open
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(w->metrics_port()));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    if (i % 2 == 1) (void)!write(fd, "GET /hea", 8);  // half a request line
    held.push_back(fd);
  }
  // A probe on a thread of its own: if the server were stuck it would never return, and the
  // test fails after a generous wait instead of hanging (killing the worker frees the thread).
  for (const char* path : {"/health", "/ready", "/metrics"}) {
    auto done = std::make_shared<std::promise<int>>();
    std::future<int> status = done->get_future();
    std::thread([port = w->metrics_port(), path, done] {
      absl::StatusOr<std::pair<int, std::string>> r = HttpGet(port, path);
      done->set_value(r.ok() ? r->first : -1);
    }).detach();
    ASSERT_EQ(status.wait_for(std::chrono::seconds(30)), std::future_status::ready)
        << path << " did not answer while other connections were open";
    EXPECT_EQ(status.get(), 200) << path;
  }
  for (int fd : held) close(fd);
  EXPECT_EQ(w->Terminate(), 0);
}

// Issue 26: the CPU pool was calloc'ed, its pages mapped on first use, so RSS grew under traffic
// and a pool larger than the machine was accepted at start and killed later.
TEST(WorkerServerTest, KvPoolsAreCommittedAtStartOrRefused) {
  const std::vector<std::string> args = {"--model", FixtureModel("tiny-llama3"), "--max-model-len",
                                         "256",     "--kv-cache-memory-gib",     "0.25"};
  ASSERT_OK_AND_ASSIGN(auto w, WorkerProcess::Start(args));
  std::ifstream status("/proc/" + std::to_string(w->pid()) + "/status");
  int64_t rss_kib = 0;
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) rss_kib = std::stoll(line.substr(6));
  }
  EXPECT_GE(rss_kib, 256 * 1024) << "the 0.25 GiB pool is not resident once ready";
  EXPECT_EQ(w->Terminate(), 0);

  const auto [exit_status, said] =
      RunWorkerToExit({"--model", FixtureModel("tiny-llama3"), "--max-model-len", "256",
                       "--kv-cache-memory-gib", "100000"});
  EXPECT_NE(exit_status, 0);
  EXPECT_NE(said.find("GiB is available"), std::string::npos) << said;
  EXPECT_NE(said.find("lower --kv-cache-memory-gib"), std::string::npos) << said;
}

// Issue 26: replies went out with ROUTER_MANDATORY off, so past the high-water mark of a router
// that read slowly they vanished: missing text, or a request that never ended. Now they wait,
// numbered 1, 2, 3, ... per request.
TEST(WorkerServerTest, RepliesToASlowReaderArriveInOrderAndWhole) {
  ASSERT_OK_AND_ASSIGN(auto w, WorkerProcess::Start(ModelArgs("tiny-llama3")));
  zmq::context_t ctx;
  Client c(ctx, w->port(), nullptr, /*small_buffers=*/true);
  constexpr int kTokens = 200;
  // Send requests and read nothing until replies wait at the worker (the kernel's socket
  // buffers take the first megabytes).
  int sent = 0;
  double waiting = 0;
  while (sent < 600 && waiting <= 0) {
    for (int i = 0; i < 12; ++i, ++sent) {
      pb::GenerateRequest r = MakeRequest(absl::StrCat("r", sent), {1, 2, 3, 4}, kTokens);
      r.mutable_sampling()->set_logprobs(20);  // large replies fill the queues sooner
      ASSERT_OK(c.Send(r));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ASSERT_OK_AND_ASSIGN(auto metrics, HttpGet(w->metrics_port(), "/metrics"));
    waiting = MetricValue(metrics.second, "kvserve_replies_waiting{");
  }
  const int kRequests = sent;
  std::map<std::string, uint32_t> seq;
  std::map<std::string, int> tokens;
  int finished = 0;
  while (finished < kRequests) {
    std::optional<ReceivedMessage> m = c.Receive(20000);
    ASSERT_TRUE(m.has_value()) << "replies stopped with " << finished << " requests finished";
    pb::GenerateResponse r;
    ASSERT_OK(ParseMessage(*m, &r));
    ASSERT_EQ(r.seq(), ++seq[r.request_id()]) << r.request_id();
    tokens[r.request_id()] += r.token_ids_size();
    ASSERT_NE(r.finish_reason(), pb::FINISH_REASON_ERROR) << r.error().message();
    finished += r.has_usage();
  }
  for (const auto& [id, n] : tokens) EXPECT_EQ(n, kTokens) << id;
  ASSERT_OK_AND_ASSIGN(auto metrics, HttpGet(w->metrics_port(), "/metrics"));
  EXPECT_GT(MetricValue(metrics.second, "kvserve_replies_waited_total{"), 0)
      << "the test never made the worker's replies wait";
  EXPECT_EQ(MetricValue(metrics.second, "kvserve_replies_dropped_total{"), 0);
  EXPECT_EQ(w->Terminate(), 0);
}

// A layer stream's ask (docs/DISAGGREGATION.md) names a device-to-device link; a CPU worker has
// none, so the ask is refused at once with an error chunk naming the link, and the request it
// named is then served as any other.
TEST(WorkerServerTest, ALayerStreamAskWithoutItsLinkIsRefusedByName) {
  ASSERT_OK_AND_ASSIGN(auto w, WorkerProcess::Start(ModelArgs("tiny-llama3")));
  zmq::context_t ctx;
  Client c(ctx, w->port());
  pb::KvExportRequest ask;
  ask.set_transfer_id("t#1.1");
  for (int i = 0; i < 40; ++i) ask.add_token_ids(i + 1);
  ask.set_link_id(7);
  ask.set_stream_request_id("streamed");
  ASSERT_OK(c.Send(ask));
  std::optional<ReceivedMessage> m = c.Receive(20000);
  ASSERT_TRUE(m.has_value());
  pb::KvChunk chunk;
  ASSERT_OK(ParseMessage(*m, &chunk));
  EXPECT_EQ(chunk.transfer_id(), "t#1.1");
  EXPECT_TRUE(chunk.last());
  EXPECT_EQ(chunk.error().code(), static_cast<int>(absl::StatusCode::kFailedPrecondition));
  EXPECT_EQ(chunk.error().message(), "KV link 7 is not open here");
  auto got = RunRequests(c, {MakeRequest("streamed", {1, 2, 3, 4}, 5)});
  EXPECT_EQ(got["streamed"].size(), 5u);
  EXPECT_EQ(w->Terminate(), 0);
}

// Issue 26: --device null serves the real protocol with no model behind it (config.json is all it
// reads), so that the router can be measured on its own.
TEST(WorkerServerTest, TheNullDeviceAnswersAFixedTokenWithoutWeights) {
  char dir[] = "/tmp/kvserve-null-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  std::filesystem::copy_file(FixtureModel("tiny-llama3") + "/config.json",
                             std::string(dir) + "/config.json");
  ASSERT_OK_AND_ASSIGN(
      auto w, WorkerProcess::Start({"--model", dir, "--device", "null", "--max-model-len", "256",
                                    "--num-blocks", "256"}));
  zmq::context_t ctx;
  Client c(ctx, w->port());
  pb::GenerateRequest r = MakeRequest("null", {1, 2, 3, 4}, 7);
  r.mutable_sampling()->set_n(2);
  auto got = RunRequests(c, {r});
  ASSERT_EQ(got["null"].size(), 14u);
  for (int32_t t : got["null"]) EXPECT_EQ(t, got["null"][0]);
  EXPECT_EQ(w->Terminate(), 0);
  std::filesystem::remove_all(dir);
}

TEST(WorkerServerTest, SigtermFinishesInFlightRequestsThenExits) {
  ASSERT_OK_AND_ASSIGN(auto w, WorkerProcess::Start(ModelArgs("tiny-llama3")));
  zmq::context_t ctx;
  Client c(ctx, w->port());
  ASSERT_OK(c.Send(MakeRequest("long", std::vector<int32_t>(20, 7), 150)));
  std::optional<ReceivedMessage> first = c.Receive(10000);  // it is running
  ASSERT_TRUE(first.has_value());
  kill(w->pid(), SIGTERM);
  int tokens = 0;
  pb::GenerateResponse r;
  ASSERT_OK(ParseMessage(*first, &r));
  tokens += r.token_ids_size();
  bool finished = false;
  while (!finished) {
    std::optional<ReceivedMessage> m = c.Receive(20000);
    ASSERT_TRUE(m.has_value());
    ASSERT_OK(ParseMessage(*m, &r));
    tokens += r.token_ids_size();
    finished = r.has_usage() || r.finish_reason() == pb::FINISH_REASON_ERROR;
  }
  EXPECT_EQ(tokens, 150);
  EXPECT_EQ(r.finish_reason(), pb::FINISH_REASON_LENGTH);
  EXPECT_EQ(w->Terminate(), 0);  // already exiting: returns its code
}

TEST(WorkerServerTest, FiveRecyclesUnderLoadLoseNothing) {
  std::vector<std::string> args = ModelArgs("tiny-qwen3");
  args.insert(args.end(), {"--recycle-after-requests", "6"});
  ASSERT_OK_AND_ASSIGN(auto w, WorkerProcess::Start(args));
  zmq::context_t ctx;
  std::atomic<bool> stop{false};
  std::atomic<int> grants{0};
  std::atomic<bool> granted{false};  // like the router: no traffic to a recycling worker
  // The test plays the router's recycle coordinator: grant every request.
  std::thread coordinator([&] {
    zmq::socket_t sub(ctx, zmq::socket_type::sub);
    sub.set(zmq::sockopt::subscribe, "control");
    sub.connect(absl::StrCat("tcp://127.0.0.1:", w->events_port()));
    Client grant(ctx, w->port());
    std::set<uint64_t> granted_instances;
    while (!stop) {
      zmq::pollitem_t items[] = {{sub.handle(), 0, ZMQ_POLLIN, 0}};
      zmq::poll(items, 1, std::chrono::milliseconds(50));
      if (!(items[0].revents & ZMQ_POLLIN)) continue;
      auto m = ReceiveMessage(sub, true, zmq::recv_flags::dontwait);
      if (!m.ok() || !m->has_value()) continue;
      pb::Control ask;
      if (!ParseMessage(**m, &ask).ok() || ask.action() != pb::CONTROL_ACTION_RECYCLE_REQUEST)
        continue;
      if (granted_instances.count(ask.instance_id())) continue;  // one slot per instance
      granted_instances.insert(ask.instance_id());
      pb::Control g;
      g.set_action(pb::CONTROL_ACTION_RECYCLE_GRANT);
      g.set_reason(ask.reason());
      g.set_instance_id(ask.instance_id());
      granted = true;
      grant.Send(g).IgnoreError();
      ++grants;
      while (grant.Receive(10).has_value()) {
      }
    }
  });
  Client c(ctx, w->port());
  std::set<uint64_t> instances = {w->instance_id()};
  int completed = 0, failed = 0, retries = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(150);
  while (instances.size() < 6 && std::chrono::steady_clock::now() < deadline) {
    if (granted.exchange(false)) {  // the router stops routing to it until it is back
      auto next = w->WaitForNewInstance(w->instance_id(), 60);
      if (next.ok()) instances.insert(*next);
    }
    const std::string id = "load" + std::to_string(completed) + "_" + std::to_string(retries);
    ASSERT_OK(c.Send(MakeRequest(id, {3, 1, 4, 1, 5, 9, 2, 6}, 5)));
    int tokens = 0;
    while (true) {
      std::optional<ReceivedMessage> m = c.Receive(30000);
      if (!m) {
        ++failed;  // lost
        break;
      }
      pb::GenerateResponse r;
      if (!ParseMessage(*m, &r).ok() || r.request_id() != id) continue;
      tokens += r.token_ids_size();
      if (r.finish_reason() == pb::FINISH_REASON_ERROR) {
        if (r.error().code() == static_cast<int>(absl::StatusCode::kFailedPrecondition)) {
          ++retries;  // draining: a router would send it elsewhere; here, wait and resend
          auto next = w->WaitForNewInstance(w->instance_id(), 60);
          if (next.ok()) instances.insert(*next);
        } else {
          ++failed;
        }
        break;
      }
      if (r.has_usage()) {
        completed += tokens == 5;
        failed += tokens != 5;
        break;
      }
    }
    auto latest = w->WaitForNewInstance(0, 1);  // whatever instance runs now
    if (latest.ok()) instances.insert(*latest);
  }
  stop = true;
  coordinator.join();
  EXPECT_EQ(failed, 0);
  EXPECT_GE(completed, 30);
  RecordProperty("retries_while_draining", retries);
  EXPECT_GE(instances.size(), 6u) << "5 recycles means 6 instances";
  EXPECT_GE(grants.load(), 5);
  auto ready = HttpGet(w->metrics_port(), "/ready");
  ASSERT_OK(ready.status());
  EXPECT_EQ(ready->first, 200);
  EXPECT_EQ(w->Terminate(), 0);
}

}  // namespace
}  // namespace kvserve::testing
