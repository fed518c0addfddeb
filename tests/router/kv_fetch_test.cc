// KV that moves between workers, end to end (docs/DISAGGREGATION.md).
//
// Peer prefix fetch (router/kv_fetch.h): a RouterCore in front of two real kvserve-worker
// processes with int8 KV caches. Worker B computes a prompt; B then drains and
// the same prompt goes to worker A, which pulls B's blocks (one per chunk) through the router
// instead of prefilling them. The link between the router and B runs through a proxy that can
// corrupt, delay or drop B's chunks. Every case ends with A's greedy tokens equal to B's, no
// request hangs, and both pools hold no active block afterwards.
//
// Disaggregated serving: a prefill worker and a decode worker behind one core, in every KV
// format and with tensor parallelism 2 on both sides: a long prompt's greedy tokens equal
// those an aggregated worker gives, its decode worker prefilling only the last partial block;
// a short prompt stays on the decode worker.
#include <signal.h>

#include <atomic>
#include <deque>
#include <future>
#include <mutex>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/net/zmq_framing.h"
#include "gtest/gtest.h"
#include "router/router_core.h"
#include "router/router_metrics.h"
#include "tests/router/kv_transfer_testing.h"
#include "tests/testing/paths.h"
#include "tests/testing/status_matchers.h"
#include "tests/worker/server/worker_process.h"

namespace kvserve::router {
namespace {

namespace pb = ::kvserve::v1;
using kvserve::testing::WorkerProcess;
using Clock = std::chrono::steady_clock;

// Between the router and a worker's ROUTER port: passes every message, but KvChunks as set.
class LinkProxy {
 public:
  enum class Mode { kPass, kCorrupt, kDelay, kDrop };

  explicit LinkProxy(int worker_port) {
    port_ = *BindTcp(front_, "127.0.0.1", 0, "proxy");
    back_.connect(absl::StrCat("tcp://127.0.0.1:", worker_port));
    thread_ = std::thread([this] { Loop(); });
  }
  ~LinkProxy() {
    stop_ = true;
    thread_.join();
  }
  int port() const { return port_; }
  // kCorrupt: a byte flips in each of `count` chunks after the next `skip`; kDelay: chunks
  // wait `delay`; kDrop: chunks vanish.
  void Set(Mode mode, int count = 0, std::chrono::milliseconds delay = {}, int skip = 0) {
    std::lock_guard lock(mu_);
    mode_ = mode;
    count_ = count;
    delay_ = delay;
    skip_ = skip;
  }
  int chunks() const { return chunks_.load(); }

 private:
  void Loop() {
    while (!stop_) {
      zmq::pollitem_t items[] = {{front_.handle(), 0, ZMQ_POLLIN, 0},
                                 {back_.handle(), 0, ZMQ_POLLIN, 0}};
      zmq::poll(items, 2, std::chrono::milliseconds(5));
      if (items[0].revents & ZMQ_POLLIN) {
        auto frames = ReceiveFrames(front_, zmq::recv_flags::dontwait);
        if (frames.ok() && frames->has_value() && (*frames)->size() == 3) {
          peer_ = (**frames)[0];
          const std::string_view out[] = {(**frames)[1], (**frames)[2]};
          SendFrames(back_, out).IgnoreError();
        }
      }
      if (items[1].revents & ZMQ_POLLIN) {
        auto frames = ReceiveFrames(back_, zmq::recv_flags::dontwait);
        if (frames.ok() && frames->has_value() && (*frames)->size() == 2) Back(std::move(**frames));
      }
      while (!delayed_.empty() && delayed_.front().first <= Clock::now()) {
        ToFront(delayed_.front().second);
        delayed_.pop_front();
      }
    }
  }

  void Back(std::vector<std::string> frames) {
    if (frames[0] != "KvChunk") {
      ToFront(frames);
      return;
    }
    ++chunks_;
    std::lock_guard lock(mu_);
    if (mode_ == Mode::kDrop) return;
    if (mode_ == Mode::kDelay) {
      delayed_.emplace_back(Clock::now() + delay_, std::move(frames));
      return;
    }
    if (mode_ == Mode::kCorrupt && skip_ > 0) {
      --skip_;
    } else if (mode_ == Mode::kCorrupt && count_ > 0) {
      --count_;
      pb::KvChunk c;
      if (c.ParseFromString(frames[1]) && c.rank_wires_size() > 0) {
        std::string* wire = c.mutable_rank_wires(0);
        (*wire)[wire->size() - 20] ^= 0x40;  // in the last block's bytes
        frames[1] = c.SerializeAsString();
      }
    }
    ToFront(frames);
  }

  void ToFront(const std::vector<std::string>& frames) {
    const std::string_view out[] = {peer_, frames[0], frames[1]};
    SendFrames(front_, out).IgnoreError();
  }

  zmq::context_t ctx_;
  zmq::socket_t front_{ctx_, zmq::socket_type::router}, back_{ctx_, zmq::socket_type::dealer};
  int port_ = 0;
  std::string peer_;
  std::atomic<bool> stop_{false};
  std::atomic<int> chunks_{0};
  std::mutex mu_;
  Mode mode_ = Mode::kPass;
  int count_ = 0, skip_ = 0;
  std::chrono::milliseconds delay_{0};
  std::deque<std::pair<Clock::time_point, std::vector<std::string>>> delayed_;
  std::thread thread_;
};

class KvFetchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::vector<std::string> args = {
        "--model",          kvserve::testing::FixtureModel("tiny-llama3"),
        "--max-model-len",  "512",
        "--num-blocks",     "96",
        "--kv-cache-dtype", "int8"};
    ASSERT_OK_AND_ASSIGN(a_, WorkerProcess::Start(args));
    ASSERT_OK_AND_ASSIGN(b_, WorkerProcess::Start(args));
    proxy_ = std::make_unique<LinkProxy>(b_->port());
  }

  void StartCore(absl::Duration timeout = absl::Seconds(5)) {
    RouterOptions o;
    o.workers = {{"a", "127.0.0.1", a_->port(), a_->events_port()},
                 {"b", "127.0.0.1", proxy_->port(), b_->events_port()}};
    // Short, so that a killed worker goes silent soon; not shorter, or a loaded machine's
    // late heartbeat takes a live worker out (seen with the monitoring test beside this one).
    o.heartbeat_timeout = absl::Seconds(2);
    o.metrics = &metrics_;
    o.kv_fetch = {.enabled = true, .min_blocks = 2, .timeout = timeout, .max_chunk_bytes = 1};
    core_ = std::make_unique<RouterCore>(o);
    core_->Start();
  }

  void TearDown() override {
    if (core_) core_->Stop();
  }

  // Waits until the core sees worker `name` in `eligible`, and fresh.
  void WaitEligible(const std::string& name, bool eligible) {
    for (int i = 0; i < 1000; ++i) {
      for (const WorkerInfo& w : core_->Workers()) {
        if (w.name == name && w.eligible == eligible && !w.state.empty()) return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    FAIL() << "worker " << name << " never became " << (eligible ? "eligible" : "ineligible");
  }

  // Runs `prompt` on worker B alone, then turns B to draining and A to ready: the next request
  // goes to A, and B still answers for its cache.
  Answer WarmOnB(const std::vector<int32_t>& prompt) {
    EXPECT_OK(core_->Control("a", pb::CONTROL_ACTION_DRAIN));
    WaitEligible("a", false);
    WaitEligible("b", true);
    Answer want = Run("warm", prompt);
    EXPECT_OK(core_->Control("a", pb::CONTROL_ACTION_UNDRAIN));
    EXPECT_OK(core_->Control("b", pb::CONTROL_ACTION_DRAIN));
    WaitEligible("a", true);
    WaitEligible("b", false);
    std::this_thread::sleep_for(std::chrono::milliseconds(400));  // B's measured prefill rate in
    return want;
  }

  Answer Run(const std::string& id, const std::vector<int32_t>& prompt, int max_tokens = 8,
             const std::function<void()>& on_first = nullptr) {
    return RunOn(*core_, id, prompt, max_tokens, on_first);
  }

  // Both pools hold no block for a request once the heartbeats say so.
  void ExpectNoActiveBlocks() {
    for (int i = 0; i < 300; ++i) {
      bool idle = true;
      for (const WorkerInfo& w : core_->Workers()) idle = idle && w.device_blocks_active == 0;
      if (idle) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ADD_FAILURE() << "a worker still holds active blocks";
  }

  std::string RouterMetricsText() const { return metrics_.Serialize(); }
  std::string WorkerMetrics(const WorkerProcess& w) const {
    absl::StatusOr<std::pair<int, std::string>> r =
        kvserve::testing::HttpGet(w.metrics_port(), "/metrics");
    return r.ok() ? r->second : "";
  }

  std::unique_ptr<WorkerProcess> a_, b_;
  std::unique_ptr<LinkProxy> proxy_;
  RouterMetrics metrics_;
  std::unique_ptr<RouterCore> core_;
};

TEST_F(KvFetchTest, PeerBlocksServeTheRequestAsItsOwnPrefillWould) {
  StartCore();
  const std::vector<int32_t> prompt = Prompt(1);
  const Answer want = WarmOnB(prompt);
  ASSERT_TRUE(want.error.empty()) << want.error;
  ASSERT_EQ(want.cached, 0);
  const Answer got = Run("r", prompt);
  ASSERT_TRUE(got.error.empty()) << got.error;
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(got.cached, kFullBlockTokens) << "A's prefill skipped B's ten blocks";
  EXPECT_GE(proxy_->chunks(), 10) << "one block per chunk";
  const std::string router = RouterMetricsText();
  EXPECT_EQ(Metric(router, R"(kvserve_router_kv_fetches_total{result="done"})"), 1) << router;
  EXPECT_EQ(Metric(router, "kvserve_router_kv_fetch_blocks_total"), 10);
  EXPECT_GT(Metric(router, "kvserve_router_kv_fetch_bytes_total"), 0);
  EXPECT_GT(Metric(router, "kvserve_router_kv_fetch_gbps"), 0);
  const std::string a = WorkerMetrics(*a_);
  EXPECT_EQ(Metric(a, R"(kvserve_kv_transfer_blocks_total{direction="in",format="int8")"), 10) << a;
  EXPECT_EQ(Metric(WorkerMetrics(*b_),
                   R"(kvserve_kv_transfer_blocks_total{direction="out",format="int8")"),
            10);
  // The index learned A's copies from A's own events.
  for (int i = 0; i < 100; ++i) {
    const std::vector<WorkerInfo> w = core_->Workers();
    if (w[0].index_blocks >= 10) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_GE(core_->Workers()[0].index_blocks, 10);
  ExpectNoActiveBlocks();
}

TEST_F(KvFetchTest, ACorruptedChunkIsRefusedAndTheRetryResumesAfterTheLastGoodOne) {
  StartCore();
  const std::vector<int32_t> prompt = Prompt(2);
  const Answer want = WarmOnB(prompt);
  proxy_->Set(LinkProxy::Mode::kCorrupt, 1, {}, /*skip=*/3);
  const Answer got = Run("r", prompt);
  ASSERT_TRUE(got.error.empty()) << got.error;
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(got.cached, kFullBlockTokens);
  const std::string router = RouterMetricsText();
  EXPECT_EQ(Metric(router, R"(kvserve_router_kv_fetch_retries_total{reason="checksum"})"), 1)
      << router;
  EXPECT_EQ(Metric(router, R"(kvserve_router_kv_fetches_total{result="done"})"), 1);
  const std::string a = WorkerMetrics(*a_);
  EXPECT_EQ(Metric(a, R"(kvserve_kv_transfer_failures_total{direction="in",reason="checksum")"), 1)
      << a;
  EXPECT_EQ(Metric(router, "kvserve_router_kv_fetch_blocks_total"), 10)
      << "three blocks before the bad chunk, seven after it";
  ExpectNoActiveBlocks();
}

TEST_F(KvFetchTest, ChunksCorruptedOnBothAttemptsLeaveTheRequestToPrefillItself) {
  StartCore();
  const std::vector<int32_t> prompt = Prompt(3);
  const Answer want = WarmOnB(prompt);
  proxy_->Set(LinkProxy::Mode::kCorrupt, 1000);
  const Answer got = Run("r", prompt);
  ASSERT_TRUE(got.error.empty()) << got.error;
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(got.cached, 0) << "nothing corrupted was cached";
  EXPECT_EQ(
      Metric(RouterMetricsText(), R"(kvserve_router_kv_fetch_fallbacks_total{reason="checksum"})"),
      1);
  ExpectNoActiveBlocks();
}

TEST_F(KvFetchTest, ASlowLinkTimesOutTwiceAndTheRequestPrefillsItself) {
  StartCore(absl::Milliseconds(200));
  const std::vector<int32_t> prompt = Prompt(4);
  const Answer want = WarmOnB(prompt);
  proxy_->Set(LinkProxy::Mode::kDelay, 0, std::chrono::milliseconds(3000));
  const Answer got = Run("r", prompt);
  ASSERT_TRUE(got.error.empty()) << got.error;
  EXPECT_EQ(got.tokens, want.tokens);
  const std::string router = RouterMetricsText();
  EXPECT_EQ(Metric(router, R"(kvserve_router_kv_fetch_retries_total{reason="timeout"})"), 1)
      << router;
  EXPECT_EQ(Metric(router, R"(kvserve_router_kv_fetch_fallbacks_total{reason="timeout"})"), 1);
  // The late chunks of both attempts arrive afterwards and are dropped.
  std::this_thread::sleep_for(std::chrono::milliseconds(3200));
  ExpectNoActiveBlocks();
}

TEST_F(KvFetchTest, TheSourceKilledMidTransferEndsTheFetchNotTheRequest) {
  StartCore();
  const std::vector<int32_t> prompt = Prompt(5);
  const Answer want = WarmOnB(prompt);
  proxy_->Set(LinkProxy::Mode::kDrop);
  std::thread killer([&] {
    for (int i = 0; i < 1000 && proxy_->chunks() == 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    kill(b_->pid(), SIGKILL);
  });
  const Answer got = Run("r", prompt);
  killer.join();
  ASSERT_TRUE(got.error.empty()) << got.error;
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(got.cached, 0);
  EXPECT_EQ(Metric(RouterMetricsText(),
                   R"(kvserve_router_kv_fetch_fallbacks_total{reason="unavailable"})"),
            1);
  // A's pool, once its heartbeat has caught up with the request's end (B is dead).
  for (int i = 0; i < 300 && core_->Workers()[0].device_blocks_active != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(core_->Workers()[0].device_blocks_active, 0);
}

TEST_F(KvFetchTest, TheTargetKilledAfterTheHandOffEndsTheRequestWithAnError) {
  StartCore();
  const std::vector<int32_t> prompt = Prompt(6);
  WarmOnB(prompt);
  // 300 tokens to make: A dies long before its answer could end.
  const Answer got = Run("r", prompt, 300, [&] { kill(a_->pid(), SIGKILL); });
  EXPECT_NE(got.error.find("stopped responding"), std::string::npos) << got.error;
  EXPECT_EQ(Metric(RouterMetricsText(), R"(kvserve_router_kv_fetches_total{result="done"})"), 1);
  const std::vector<WorkerInfo> w = core_->Workers();
  EXPECT_EQ(w[1].device_blocks_active, 0) << "the source holds nothing for the request";
}

struct DisaggCase {
  std::string name;
  std::vector<std::string> flags;
};

class DisaggregatedTest : public ::testing::TestWithParam<DisaggCase> {
 protected:
  static std::vector<std::string> Args(const std::string& role) {
    std::vector<std::string> args = {
        "--model",         kvserve::testing::FixtureModel("tiny-llama3"),
        "--max-model-len", "512",
        "--num-blocks",    "96",
        "--role",          role};
    args.insert(args.end(), GetParam().flags.begin(), GetParam().flags.end());
    return args;
  }

  static Answer Run(RouterCore& core, const std::string& id, const std::vector<int32_t>& prompt) {
    return RunOn(core, id, prompt);
  }

  // A core over one prefill and one decode worker, counting into `metrics`, that sends prompts
  // of more than 32 tokens to the prefill worker first.
  static RouterOptions Pair(const WorkerProcess& prefill, const WorkerProcess& decode,
                            RouterMetrics* metrics) {
    RouterOptions o;
    o.workers = {{"prefill", "127.0.0.1", prefill.port(), prefill.events_port()},
                 {"decode", "127.0.0.1", decode.port(), decode.events_port()}};
    o.metrics = metrics;
    o.max_local_prefill_tokens = 32;
    return o;
  }
};

TEST_P(DisaggregatedTest, ALongPromptPrefillsOnThePrefillWorkerAndDecodesAsAggregated) {
  ASSERT_OK_AND_ASSIGN(auto aggregated, WorkerProcess::Start(Args("both")));
  ASSERT_OK_AND_ASSIGN(auto prefill, WorkerProcess::Start(Args("prefill")));
  ASSERT_OK_AND_ASSIGN(auto decode, WorkerProcess::Start(Args("decode")));
  const std::vector<int32_t> prompt = Prompt(7);
  const Answer want = RunAlone(*aggregated, prompt);
  ASSERT_TRUE(want.error.empty()) << want.error;

  RouterMetrics metrics;
  RouterOptions o = Pair(*prefill, *decode, &metrics);
  o.kv_fetch.max_chunk_bytes = 1;  // one block a chunk
  RouterCore core(o);
  core.Start();
  WaitReady(core, 2);
  const Answer got = Run(core, "r", prompt);
  ASSERT_TRUE(got.error.empty()) << got.error;
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(got.cached, kFullBlockTokens) << "the decode worker prefilled only the partial block";
  const std::string text = metrics.Serialize();
  EXPECT_EQ(Metric(text, R"(kvserve_router_disaggregated_requests_total{result="prefilled"})"), 1)
      << text;
  EXPECT_EQ(Metric(text, R"(kvserve_router_kv_fetches_total{result="done"})"), 1);
  EXPECT_EQ(Metric(text, "kvserve_router_kv_fetch_blocks_total"), 10);

  // A short prompt is cheaper to prefill where it decodes: no prefill phase.
  const Answer shortcut = Run(core, "short", {11, 12, 13, 14, 15, 16, 17, 18, 19, 20});
  ASSERT_TRUE(shortcut.error.empty()) << shortcut.error;
  EXPECT_EQ(Metric(metrics.Serialize(),
                   R"(kvserve_router_disaggregated_requests_total{result="prefilled"})"),
            1);
  // The long prompt (170 tokens, and its one token) and not the short one (10 more).
  const double computed =
      Metric(kvserve::testing::HttpGet(prefill->metrics_port(), "/metrics")->second,
             "kvserve_prompt_tokens_total");
  EXPECT_GE(computed, 170);
  EXPECT_LT(computed, 180) << "the prefill worker prefilled the long prompt alone";
  for (int i = 0; i < 300; ++i) {
    const std::vector<WorkerInfo> w = core.Workers();
    if (w[0].device_blocks_active == 0 && w[1].device_blocks_active == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (const WorkerInfo& w : core.Workers()) EXPECT_EQ(w.device_blocks_active, 0) << w.name;
  core.Stop();
}

TEST_P(DisaggregatedTest, APrefillWorkerThatHangsLeavesThePrefillToTheDecodeWorker) {
  ASSERT_OK_AND_ASSIGN(auto prefill, WorkerProcess::Start(Args("prefill")));
  ASSERT_OK_AND_ASSIGN(auto decode, WorkerProcess::Start(Args("decode")));
  RouterMetrics metrics;
  RouterOptions o = Pair(*prefill, *decode, &metrics);
  o.heartbeat_timeout = absl::Seconds(1);
  RouterCore core(o);
  core.Start();
  WaitReady(core, 2);
  const std::vector<int32_t> prompt = Prompt(8);
  // Frozen, the prefill worker still looks ready until its heartbeat is a second old: the
  // prefill phase goes to it and never ends there.
  ASSERT_EQ(kill(prefill->pid(), SIGSTOP), 0);
  const Answer got = Run(core, "r", prompt);
  kill(prefill->pid(), SIGCONT);
  ASSERT_TRUE(got.error.empty()) << got.error;
  EXPECT_EQ(got.tokens.size(), 8u);
  EXPECT_EQ(got.cached, 0) << "the decode worker prefilled the whole prompt";
  EXPECT_EQ(Metric(metrics.Serialize(),
                   R"(kvserve_router_disaggregated_requests_total{result="prefill_failed"})"),
            1);
  // The same prompt, aggregated, gives the same tokens: the decode worker now caches it.
  const Answer again = Run(core, "again", prompt);
  EXPECT_EQ(again.tokens, got.tokens);
  core.Stop();
}

INSTANTIATE_TEST_SUITE_P(
    EveryFormatAndTp2, DisaggregatedTest,
    ::testing::Values(DisaggCase{"fp32", {}}, DisaggCase{"bf16", {"--kv-cache-dtype", "bf16"}},
                      DisaggCase{"fp8", {"--kv-cache-dtype", "fp8_e4m3"}},
                      DisaggCase{"int8", {"--kv-cache-dtype", "int8"}},
                      DisaggCase{"int4",
                                 {"--kv-cache-dtype", "int4", "--kv-quant-granularity", "per_group",
                                  "--kv-quant-group-size", "8"}},
                      DisaggCase{"int8_tp2",
                                 {"--kv-cache-dtype", "int8", "--tensor-parallel-size", "2"}}),
    [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace kvserve::router
