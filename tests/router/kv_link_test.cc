// KV over device-to-device links, end to end (docs/DISAGGREGATION.md, router/kv_links.h): a
// RouterCore with --kv-links in front of a prefill and a decode kvserve-worker on the emulated
// CUDA device (tests/testing/cuda_emulator: the link's NCCL runs between the two processes over
// the emulator's sockets). The router pairs them, a long prompt's prefill phase runs on the
// prefill worker and its blocks cross the link, and the decode worker's greedy tokens equal an
// aggregated worker's, also with tensor parallelism 2 on both sides; a prefill worker that dies
// takes its link with it, and the decode worker serves the next long prompt by itself. Built in the
// emulated build only (label gpu): two ranks cannot share the one GPU a GPU machine here has.
#include <signal.h>

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

std::vector<std::string> Args(const std::string& role, int tp = 1) {
  return {"--model",
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

std::string WorkerMetrics(const WorkerProcess& w) {
  absl::StatusOr<std::pair<int, std::string>> r =
      kvserve::testing::HttpGet(w.metrics_port(), "/metrics");
  return r.ok() ? r->second : "";
}

// A core with --kv-links before `prefill` and `decode`, once it has paired them.
std::unique_ptr<RouterCore> LinkedCore(const WorkerProcess& prefill, const WorkerProcess& decode,
                                       RouterMetrics& metrics) {
  RouterOptions o;
  o.workers = {{"prefill", "127.0.0.1", prefill.port(), prefill.events_port()},
               {"decode", "127.0.0.1", decode.port(), decode.events_port()}};
  o.metrics = &metrics;
  o.max_local_prefill_tokens = 32;
  o.heartbeat_timeout = kSlowStepHeartbeatTimeout;
  o.kv_fetch.links = true;
  o.kv_fetch.link_timeout = absl::Seconds(20);
  o.kv_fetch.max_chunk_bytes = 1;  // one block a chunk: ten headers, ten sends over the link
  auto core = std::make_unique<RouterCore>(o);
  core->Start();
  WaitReady(*core, 2);
  EXPECT_TRUE(WaitMetric(metrics, "kvserve_router_kv_links_ready", 1))
      << "the router never paired the two workers: " << metrics.Serialize();
  return core;
}

// The long prompt's prefill phase runs on the prefill worker, its ten blocks cross the link,
// and the decode worker, prefilling only the partial block, answers as `want`.
void ExpectMovedOverTheLink(RouterCore& core, const RouterMetrics& metrics,
                            const WorkerProcess& decode, const std::vector<int32_t>& prompt,
                            const Answer& want) {
  const Answer got = RunOn(core, "r", prompt);
  ASSERT_TRUE(got.error.empty()) << got.error;
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(got.cached, kFullBlockTokens) << "the decode worker prefilled only the partial block";
  const std::string text = metrics.Serialize();
  EXPECT_EQ(Metric(text, R"(kvserve_router_kv_link_transfers_total{result="done"})"), 1) << text;
  EXPECT_EQ(Metric(text, R"(kvserve_router_kv_fetches_total{result="done"})"), 1);
  EXPECT_EQ(Metric(WorkerMetrics(decode),
                   R"(kvserve_kv_transfer_blocks_total{direction="in",format="int8")"),
            10);
}

TEST(KvLinkTest, APrefillMovesOverTheLinkAndDecodesAsAggregated) {
  ASSERT_OK_AND_ASSIGN(auto aggregated, WorkerProcess::Start(Args("both")));
  ASSERT_OK_AND_ASSIGN(auto prefill, WorkerProcess::Start(Args("prefill")));
  ASSERT_OK_AND_ASSIGN(auto decode, WorkerProcess::Start(Args("decode")));
  const std::vector<int32_t> prompt = Prompt(3);
  const Answer want = RunAlone(*aggregated, prompt);
  ASSERT_TRUE(want.error.empty()) << want.error;
  RouterMetrics metrics;
  std::unique_ptr<RouterCore> linked = LinkedCore(*prefill, *decode, metrics);
  RouterCore& core = *linked;
  ExpectMovedOverTheLink(core, metrics, *decode, prompt, want);

  // The prefill worker dies: its link closes, and the next long prompt, whose prefill phase
  // finds no prefill worker, is prefilled by the decode worker itself.
  ASSERT_EQ(kill(prefill->pid(), SIGKILL), 0);
  EXPECT_TRUE(WaitMetric(metrics, "kvserve_router_kv_links_ready", 0));
  const Answer alone = RunOn(core, "after", Prompt(4));
  ASSERT_TRUE(alone.error.empty()) << alone.error;
  EXPECT_EQ(alone.tokens.size(), 8u);
  for (int i = 0; i < 300; ++i) {
    const std::vector<WorkerInfo> w = core.Workers();
    if (w[1].device_blocks_active == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(core.Workers()[1].device_blocks_active, 0);
  core.Stop();
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
  std::unique_ptr<RouterCore> core = LinkedCore(*prefill, *decode, metrics);
  ExpectMovedOverTheLink(*core, metrics, *decode, prompt, want);
  core->Stop();
}

}  // namespace
}  // namespace kvserve::router
