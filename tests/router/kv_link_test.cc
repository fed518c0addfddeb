// KV over device-to-device links, end to end (docs/DISAGGREGATION.md, router/kv_links.h): a
// RouterCore with --kv-links in front of a prefill and a decode kvserve-worker on the emulated
// CUDA device (tests/testing/cuda_emulator: the link's NCCL runs between the two processes over
// the emulator's sockets). The router pairs them, a long prompt's prefill phase runs on the
// prefill worker and its blocks cross the link (streamed layer by layer as the phase computes
// them, or once it ended), and the decode worker's greedy tokens equal an aggregated worker's,
// also with tensor parallelism 2 on both sides; a prefill worker that dies mid-stream
// takes its link with it, and the decode worker serves the next long prompt by itself. Built in the
// emulated build only (label gpu): two ranks cannot share the one GPU a GPU machine here has.
#include <signal.h>

#include <chrono>
#include <thread>

#include "gtest/gtest.h"
#include "router/router_core.h"
#include "router/router_metrics.h"
#include "tests/router/kv_transfer_testing.h"
#include "tests/testing/paths.h"
#include "tests/testing/status_matchers.h"
#include "tests/worker/server/worker_process.h"

namespace kvserve::router {
namespace {

using kvserve::testing::WorkerProcess;

std::vector<std::string> Args(const std::string& role, int tp = 1,
                              const std::string& step_tokens = "2048") {
  return {"--max-num-batched-tokens",
          step_tokens,
          "--model",
          kvserve::testing::FixtureModel("tiny-llama3"),
          "--device",
          "cuda",
          "--max-model-len",
          "512",
          "--num-blocks",
          "96",
          "--kv-cache-dtype",
          "int8",
          "--role",
          role,
          "--tensor-parallel-size",
          std::to_string(tp)};
}

// Polls `core`'s metrics until `series` reads `value` (30 s at most: a dead worker's link may
// close only once its heartbeats are missed).
bool WaitMetric(const RouterMetrics& metrics, const std::string& series, double value) {
  for (int i = 0; i < 3000; ++i) {
    if (Metric(metrics.Serialize(), series) == value) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

constexpr char kBlocksIn[] = R"(kvserve_kv_transfer_blocks_total{direction="in",format="int8")";

std::string WorkerMetrics(const WorkerProcess& w) {
  absl::StatusOr<std::pair<int, std::string>> r =
      kvserve::testing::HttpGet(w.metrics_port(), "/metrics");
  return r.ok() ? r->second : "";
}

// A core with --kv-links before `prefill` and `decode`, once it has paired them; `stream`:
// --kv-link-stream-layers.
std::unique_ptr<RouterCore> LinkedCore(const WorkerProcess& prefill, const WorkerProcess& decode,
                                       RouterMetrics& metrics, bool stream) {
  RouterOptions o;
  o.workers = {{"prefill", "127.0.0.1", prefill.port(), prefill.events_port()},
               {"decode", "127.0.0.1", decode.port(), decode.events_port()}};
  o.metrics = &metrics;
  o.max_local_prefill_tokens = 32;
  o.heartbeat_timeout = kSlowStepHeartbeatTimeout;
  o.kv_fetch.links = true;
  o.kv_fetch.link_timeout = absl::Seconds(20);
  o.kv_fetch.max_chunk_bytes = 1;  // one block a chunk: ten headers, ten sends over the link
  o.kv_fetch.stream_layers = stream;
  auto core = std::make_unique<RouterCore>(o);
  core->Start();
  WaitReady(*core, 2);
  EXPECT_TRUE(WaitMetric(metrics, "kvserve_router_kv_links_ready", 1))
      << "the router never paired the two workers: " << metrics.Serialize();
  return core;
}

// The long prompt's prefill phase runs on the prefill worker, its ten blocks cross the link
// (streamed as the phase computes them, or once it ended), and the decode worker, prefilling
// only the partial block, answers as `want`.
void ExpectMovedOverTheLink(RouterCore& core, const RouterMetrics& metrics,
                            const WorkerProcess& decode, const std::vector<int32_t>& prompt,
                            const Answer& want, bool streamed) {
  const Answer got = RunOn(core, "r", prompt);
  ASSERT_TRUE(got.error.empty()) << got.error;
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(got.cached, kFullBlockTokens) << "the decode worker prefilled only the partial block";
  const std::string text = metrics.Serialize();
  EXPECT_EQ(Metric(text, R"(kvserve_router_kv_link_transfers_total{result="done"})"), 1) << text;
  EXPECT_EQ(Metric(text, R"(kvserve_router_kv_fetches_total{result="done"})"), 1);
  EXPECT_EQ(Metric(text, "kvserve_router_kv_layer_streams_total"), streamed ? 1 : -1) << text;
  // Counted as the phase ends, which a streamed request need not wait for.
  EXPECT_TRUE(
      WaitMetric(metrics, R"(kvserve_router_disaggregated_requests_total{result="prefilled"})", 1))
      << metrics.Serialize();
  EXPECT_EQ(Metric(WorkerMetrics(decode), kBlocksIn), 10);
}

// The prefill worker computes a block a step (--max-num-batched-tokens 16), and each step's
// block streams over the link layer by layer as it computes it.
TEST(KvLinkTest, APrefillStreamsOverTheLinkAndDecodesAsAggregated) {
  ASSERT_OK_AND_ASSIGN(auto aggregated, WorkerProcess::Start(Args("both")));
  ASSERT_OK_AND_ASSIGN(auto prefill, WorkerProcess::Start(Args("prefill", 1, "16")));
  ASSERT_OK_AND_ASSIGN(auto decode, WorkerProcess::Start(Args("decode")));
  const std::vector<int32_t> prompt = Prompt(3);
  const Answer want = RunAlone(*aggregated, prompt);
  ASSERT_TRUE(want.error.empty()) << want.error;
  RouterMetrics metrics;
  std::unique_ptr<RouterCore> linked = LinkedCore(*prefill, *decode, metrics, /*stream=*/true);
  RouterCore& core = *linked;
  ExpectMovedOverTheLink(core, metrics, *decode, prompt, want, /*streamed=*/true);

  // The prefill worker dies while the next long prompt's phase streams, once the decode worker
  // has cached the stream's first block: the stream fails, the link closes, and the decode
  // worker prefills what did not arrive, with the aggregated tokens still.
  const std::vector<int32_t> next = Prompt(4);
  const Answer next_want = RunAlone(*aggregated, next);
  ASSERT_TRUE(next_want.error.empty()) << next_want.error;
  double arrived = -1;
  std::thread killer([&] {
    for (int i = 0; i < 6000 && Metric(WorkerMetrics(*decode), kBlocksIn) <= 10; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    kill(prefill->pid(), SIGSTOP);  // no step after this one
    arrived = Metric(WorkerMetrics(*decode), kBlocksIn);
    kill(prefill->pid(), SIGKILL);
  });
  const Answer cut = RunOn(core, "cut", next);
  killer.join();
  EXPECT_GT(arrived, 10);
  EXPECT_LT(arrived, 20) << "the stream was not cut short";
  ASSERT_TRUE(cut.error.empty()) << cut.error;
  EXPECT_EQ(cut.tokens, next_want.tokens);
  EXPECT_EQ(Metric(metrics.Serialize(), "kvserve_router_kv_layer_streams_total"), 2);
  EXPECT_TRUE(WaitMetric(metrics, "kvserve_router_kv_links_ready", 0));
  for (int i = 0; i < 300; ++i) {
    const std::vector<WorkerInfo> w = core.Workers();
    if (w[1].device_blocks_active == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(core.Workers()[1].device_blocks_active, 0);
  core.Stop();
}

// --kv-link-stream-layers=false: the decode worker pulls the blocks over the link once the
// prefill phase ended, a chunk of one block at a time.
TEST(KvLinkTest, APrefillMovesOverTheLinkOnceItEnded) {
  ASSERT_OK_AND_ASSIGN(auto aggregated, WorkerProcess::Start(Args("both")));
  ASSERT_OK_AND_ASSIGN(auto prefill, WorkerProcess::Start(Args("prefill")));
  ASSERT_OK_AND_ASSIGN(auto decode, WorkerProcess::Start(Args("decode")));
  const std::vector<int32_t> prompt = Prompt(5);
  const Answer want = RunAlone(*aggregated, prompt);
  ASSERT_TRUE(want.error.empty()) << want.error;
  RouterMetrics metrics;
  std::unique_ptr<RouterCore> core = LinkedCore(*prefill, *decode, metrics, /*stream=*/false);
  ExpectMovedOverTheLink(*core, metrics, *decode, prompt, want, /*streamed=*/false);
  core->Stop();
}

// Tensor parallelism 2 on both sides: each rank's KV heads cross the link of its own rank (one
// NCCL communicator per rank pair, each process's two ranks on two emulated GPUs).
TEST(KvLinkTest, WithTensorParallelismEachRankMovesItsHeadsOverItsLink) {
  ASSERT_OK_AND_ASSIGN(auto aggregated, WorkerProcess::Start(Args("both", 2)));
  ASSERT_OK_AND_ASSIGN(auto prefill, WorkerProcess::Start(Args("prefill", 2)));
  ASSERT_OK_AND_ASSIGN(auto decode, WorkerProcess::Start(Args("decode", 2)));
  const std::vector<int32_t> prompt = Prompt(3);
  const Answer want = RunAlone(*aggregated, prompt);
  ASSERT_TRUE(want.error.empty()) << want.error;
  RouterMetrics metrics;
  std::unique_ptr<RouterCore> core = LinkedCore(*prefill, *decode, metrics, /*stream=*/true);
  ExpectMovedOverTheLink(*core, metrics, *decode, prompt, want, /*streamed=*/true);
  core->Stop();
}

}  // namespace
}  // namespace kvserve::router
