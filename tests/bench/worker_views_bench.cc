// What the router's workers cost it per turn at fleet scale: WorkerPool::Views() (a WorkerView
// per worker), which the core loop takes every turn and the placer for every request, and a
// turn's WorkerPool::Poll. Recorded in docs/ROUTING.md; never timed in tests.
//
//   build/bin/worker_views_bench
#include <string>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "router/worker_pool.h"

namespace kvserve::router {
namespace {

namespace pb = ::kvserve::v1;

// `workers` workers, each with a READY heartbeat as kvserve-worker sends it (its HTTP and
// metrics endpoints on ":port", its pools), on a pool whose sockets connect to nothing.
void AddWorkers(WorkerPool& pool, int workers) {
  for (int w = 0; w < workers; ++w) {
    pool.Add(
        {absl::StrCat("worker-", w), absl::StrCat("10.0.", w / 256, ".", w % 256), 5570, 5571});
    pb::WorkerStatus st;
    st.set_state(pb::WORKER_STATE_READY);
    st.set_model_id("m");
    st.set_block_size(16);
    st.set_instance_id(w + 1);
    st.set_http_endpoint(":8000");
    st.set_metrics_endpoint(":8001");
    pb::BlockCounts* b = st.add_blocks();
    b->set_medium(pb::MEDIUM_DEVICE);
    b->set_total(100000);
    pool.HandleSub(w, ReceivedMessage{"status", "WorkerStatus", st.SerializeAsString()});
  }
}

// A pool of `workers` workers (AddWorkers) with its context and index.
struct IdleFleet {
  explicit IdleFleet(int workers) { AddWorkers(pool, workers); }
  zmq::context_t ctx;
  PrefixIndex index;
  WorkerPool pool{ctx, &index, absl::Hours(1)};
};

// The views of state.range(0) workers.
void BM_Views(benchmark::State& state) {
  const int workers = static_cast<int>(state.range(0));
  IdleFleet fleet(workers);
  WorkerPool& pool = fleet.pool;
  if (static_cast<int>(pool.Views().size()) != workers || !pool.Views().back().eligible) {
    state.SkipWithError("the heartbeats were not taken");
    return;
  }
  for (auto _ : state) benchmark::DoNotOptimize(pool.Views());
  state.SetItemsProcessed(state.iterations() * workers);
}
BENCHMARK(BM_Views)->ArgName("workers")->Arg(8)->Arg(256)->Arg(1024);

// A turn of the core loop that finds nothing: WorkerPool::Poll(0) over state.range(0) idle
// workers' sockets.
void BM_PollIdle(benchmark::State& state) {
  const int workers = static_cast<int>(state.range(0));
  IdleFleet fleet(workers);
  WorkerPool& pool = fleet.pool;
  pool.Poll(0);  // the sockets' first signals
  for (auto _ : state) benchmark::DoNotOptimize(pool.Poll(0));
  state.SetItemsProcessed(state.iterations() * workers);
}
BENCHMARK(BM_PollIdle)->ArgName("workers")->Arg(8)->Arg(256)->Arg(1024);

}  // namespace
}  // namespace kvserve::router

BENCHMARK_MAIN();
