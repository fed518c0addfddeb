// The router's prefix index (router/routing/prefix_index.h) at fleet scale: how fast it takes
// the workers' KV events (block events per second), how fast a routing decision looks prompts
// up in it (block lookups per second), and what one (block, worker) entry costs in memory.
// Issue 59's goals: >= 2M block events/s and >= 2M block lookups/s per core, <= 64 bytes per
// entry. Recorded in docs/ROUTING.md; never timed in tests.
//
//   build/bin/prefix_index_bench
#include <malloc.h>

#include <algorithm>
#include <random>
#include <vector>

#include "benchmark/benchmark.h"
#include "router/routing/prefix_index.h"

namespace kvserve::router {
namespace {

namespace pb = ::kvserve::v1;

BlockHash RandomHash(std::mt19937_64& rng) { return BlockHash{rng(), rng()}; }

// A batch storing (or removing) `hashes` on the device, as a worker publishes a step's.
pb::KvEventBatch Batch(const std::vector<BlockHash>& hashes, bool stored) {
  pb::KvEventBatch b;
  b.set_instance_id(1);
  pb::KvEvent* e = b.add_events();
  if (stored) {
    for (const BlockHash& h : hashes) e->mutable_stored()->add_block_hashes(h.ToBytes());
    e->mutable_stored()->set_medium(pb::MEDIUM_DEVICE);
  } else {
    for (const BlockHash& h : hashes) e->mutable_removed()->add_block_hashes(h.ToBytes());
    e->mutable_removed()->set_medium(pb::MEDIUM_DEVICE);
  }
  return b;
}

// Batches of state.range(0) blocks stored and, kHeld batches later, removed: a worker's cache of
// ~100K blocks turning over at a steady size.
void BM_ApplyEvents(benchmark::State& state) {
  const int per_batch = static_cast<int>(state.range(0));
  const int kHeld = 100000 / per_batch, kRing = 2 * kHeld;
  std::mt19937_64 rng(1);
  std::vector<std::vector<BlockHash>> ring(kRing);
  for (auto& hashes : ring) {
    for (int i = 0; i < per_batch; ++i) hashes.push_back(RandomHash(rng));
  }
  std::vector<pb::KvEventBatch> stored, removed;
  for (const auto& hashes : ring) {
    stored.push_back(Batch(hashes, true));
    removed.push_back(Batch(hashes, false));
  }
  PrefixIndex index;
  index.SetCapacity(0, static_cast<size_t>(per_batch) * kRing);
  uint64_t seq = 0;
  int64_t step = 0;
  for (auto _ : state) {
    pb::KvEventBatch& add = stored[step % kRing];
    add.set_seq(++seq);
    benchmark::DoNotOptimize(index.ApplyEvents(0, add));
    if (step >= kHeld) {
      pb::KvEventBatch& drop = removed[(step - kHeld) % kRing];
      drop.set_seq(++seq);
      benchmark::DoNotOptimize(index.ApplyEvents(0, drop));
    }
    ++step;
  }
  // Every block stored is removed again (but the first kHeld batches'): two events each.
  state.SetItemsProcessed(2 * state.iterations() * per_batch);
  state.counters["blocks_held"] = static_cast<double>(index.num_blocks(0));
}
BENCHMARK(BM_ApplyEvents)->Arg(16)->Arg(256);

// Routing decisions: prompts of state.range(0) blocks, each looked up on each of 8 workers of
// 100K blocks that hold its first half (as a conversation's earlier turns would be); 64
// different prompts in turn, so that lookups reach all over the index as real traffic does.
void BM_LongestPrefix(benchmark::State& state) {
  const int blocks = static_cast<int>(state.range(0));
  constexpr int kWorkers = 8, kPool = 100000, kPrompts = 64;
  std::mt19937_64 rng(2);
  std::vector<std::vector<BlockHash>> prompts(kPrompts);
  std::vector<BlockHash> cached;
  for (auto& prompt : prompts) {
    for (int i = 0; i < blocks; ++i) prompt.push_back(RandomHash(rng));
    cached.insert(cached.end(), prompt.begin(), prompt.begin() + blocks / 2);
  }
  PrefixIndex index;
  for (int w = 0; w < kWorkers; ++w) {
    index.SetCapacity(w, kPool + cached.size());
    std::vector<BlockHash> held = cached;
    for (int i = 0; i < kPool; ++i) held.push_back(RandomHash(rng));
    std::shuffle(held.begin(), held.end(), rng);  // the prompts' blocks not stored together
    pb::KvEventBatch b = Batch(held, true);
    b.set_seq(1);
    index.ApplyEvents(w, b);
  }
  int64_t probes = 0;
  size_t next = 0;
  for (auto _ : state) {
    const std::vector<BlockHash>& prompt = prompts[next++ % kPrompts];
    for (int w = 0; w < kWorkers; ++w) {
      const PrefixIndex::Match m = index.LongestPrefix(w, prompt);
      probes += m.total() + 1;  // the cached run, then the first miss
      benchmark::DoNotOptimize(m);
    }
  }
  state.SetItemsProcessed(probes);
}
BENCHMARK(BM_LongestPrefix)->Arg(64)->Arg(900);

// Bytes the index takes per (block, worker) entry: heap in use before and after 8 workers of
// state.range(0) confirmed blocks each, over the entries.
void BM_BytesPerEntry(benchmark::State& state) {
  const int per_worker = static_cast<int>(state.range(0));
  constexpr int kWorkers = 8;
  std::mt19937_64 rng(3);
  std::vector<pb::KvEventBatch> batches;
  for (int w = 0; w < kWorkers; ++w) {
    std::vector<BlockHash> held;
    for (int i = 0; i < per_worker; ++i) held.push_back(RandomHash(rng));
    batches.push_back(Batch(held, true));
    batches.back().set_seq(1);
  }
  double bytes_per_entry = 0;
  for (auto _ : state) {
    const size_t before = mallinfo2().uordblks;
    {
      PrefixIndex index;
      for (int w = 0; w < kWorkers; ++w) {
        index.SetCapacity(w, per_worker);
        index.ApplyEvents(w, batches[w]);
      }
      bytes_per_entry = static_cast<double>(mallinfo2().uordblks - before) /
                        (static_cast<double>(per_worker) * kWorkers);
    }
  }
  state.counters["bytes_per_entry"] = bytes_per_entry;
}
BENCHMARK(BM_BytesPerEntry)->Arg(10000)->Arg(100000)->Iterations(1);

}  // namespace
}  // namespace kvserve::router

BENCHMARK_MAIN();
