// The router's prefix index (router/routing/prefix_index.h) at fleet scale: how fast it takes
// the workers' KV events (block events per second), how fast a routing decision looks prompts
// up in it (block lookups per second), what one (block, worker) entry costs in memory, and a
// whole cost-policy placement over 256 and 1,024 workers (BM_RouteFleet).
// Issue 59's goals: >= 2M block events/s and >= 2M block lookups/s per core, <= 64 bytes per
// entry. Recorded in docs/ROUTING.md; never timed in tests.
//
//   build/bin/prefix_index_bench
#include <malloc.h>

#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "benchmark/benchmark.h"
#include "common/huge_pages.h"
#include "google/protobuf/arena.h"
#include "router/policies/factory.h"
#include "router/routing/fetch_plan.h"
#include "router/routing/prefix_index.h"
#include "router/routing/snapshot_build.h"

namespace kvserve::router {
namespace {

namespace pb = ::kvserve::v1;

BlockHash RandomHash(std::mt19937_64& rng) { return BlockHash{rng(), rng()}; }

// splitmix64's finalizer: distinct inputs give distinct, random-looking outputs.
uint64_t SplitMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9;
  x = (x ^ (x >> 27)) * 0x94d049bb133111eb;
  return x ^ (x >> 31);
}

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

// A router's index filling: 8 workers with pools of state.range(0) blocks, each in turn storing
// a batch of 16 new blocks until every pool is full, as after a cluster's start (a router that
// starts later rebuilds from snapshots instead). state.range(1) = 1: the pools' sizes are known
// first (the workers' heartbeats, as in a router), so each table is sized for its pool before
// it stores; 0: not known, each table grows by doubling as it fills. Side by side, one run.
void BM_FillFromEmpty(benchmark::State& state) {
  const int pool = static_cast<int>(state.range(0));
  const bool known = state.range(1) != 0;
  constexpr int kWorkers = 8, kPerBatch = 16;
  std::vector<std::vector<pb::KvEventBatch>> batches(kWorkers);
  for (int w = 0; w < kWorkers; ++w) {
    for (int first = 0; first + kPerBatch <= pool; first += kPerBatch) {
      std::vector<BlockHash> hashes;
      for (int i = 0; i < kPerBatch; ++i) {
        const uint64_t x = (static_cast<uint64_t>(w) << 40) ^ static_cast<uint64_t>(first + i);
        hashes.push_back(BlockHash{SplitMix(x), SplitMix(~x)});
      }
      pb::KvEventBatch b = Batch(hashes, true);
      b.set_seq(batches[w].size() + 1);
      batches[w].push_back(std::move(b));
    }
  }
  for (auto _ : state) {
    PrefixIndex index;
    if (known) {
      for (int w = 0; w < kWorkers; ++w) index.SetCapacity(w, pool);
    }
    for (size_t i = 0; i < batches[0].size(); ++i) {
      for (int w = 0; w < kWorkers; ++w)
        benchmark::DoNotOptimize(index.ApplyEvents(w, batches[w][i]));
    }
    state.PauseTiming();  // freeing the index is not filling it
    index = PrefixIndex();
    state.ResumeTiming();
  }
  state.SetItemsProcessed(state.iterations() * kWorkers * batches[0].size() * kPerBatch);
}
BENCHMARK(BM_FillFromEmpty)
    ->ArgNames({"pool", "known"})
    ->Args({40000, 0})
    ->Args({40000, 1})
    ->Args({100000, 0})
    ->Args({100000, 1})
    ->Unit(benchmark::kMillisecond);

// The same at fleet scale: state.range(1) workers of 64K blocks each (16.8M entries at 256, ~0.6
// GB), each step one worker (in turn) storing state.range(0) new blocks and removing as many of
// its oldest, so that every event lands in a table far out of cache, as in a fleet's router
// (docs/ROUTING.md). Each batch is parsed off its wire bytes and applied, as WorkerPool does;
// the bytes are built ahead, kAhead steps at a time, off the clock.
void BM_ParseAndApplyFleet(benchmark::State& state) {
  const int per_batch = static_cast<int>(state.range(0));
  const int workers = static_cast<int>(state.range(1));
  constexpr int kHeld = 1 << 16, kAhead = 1024;
  // Worker w's n-th block: distinct over (w, n), random-looking as real hashes are.
  const auto hash = [](int w, int64_t n) {
    const uint64_t x = (static_cast<uint64_t>(w) << 40) ^ static_cast<uint64_t>(n);
    return BlockHash{SplitMix(x), SplitMix(~x)};
  };
  const auto batch = [&](int w, int64_t first, int count, bool stored) {
    std::vector<BlockHash> hashes;
    for (int i = 0; i < count; ++i) hashes.push_back(hash(w, first + i));
    return Batch(hashes, stored);
  };
  PrefixIndex index;
  std::vector<int64_t> next(workers, 0);
  std::vector<uint64_t> seq(workers, 0);
  for (int w = 0; w < workers; ++w) {
    index.SetCapacity(w, 2 * kHeld);
    for (; next[w] < kHeld; next[w] += 4096) {
      pb::KvEventBatch b = batch(w, next[w], 4096, true);
      b.set_seq(++seq[w]);
      index.ApplyEvents(w, b);
    }
  }
  // Each step: the worker, its stored batch and its removed batch as they come off the wire.
  std::vector<std::tuple<int, std::string, std::string>> ahead;
  size_t at = 0;
  int64_t step = 0;
  // Parsed as WorkerPool parses them: into an arena over a reused block.
  std::vector<char> arena_block(256 << 10);
  const auto take = [&](int w, const std::string& wire) {
    google::protobuf::ArenaOptions options;
    options.initial_block = arena_block.data();
    options.initial_block_size = arena_block.size();
    google::protobuf::Arena arena(options);
    auto* b = google::protobuf::Arena::CreateMessage<pb::KvEventBatch>(&arena);
    b->ParseFromString(wire);
    benchmark::DoNotOptimize(index.ApplyEvents(w, *b));
  };
  for (auto _ : state) {
    if (at == ahead.size()) {
      state.PauseTiming();
      ahead.clear();
      for (int k = 0; k < kAhead; ++k, ++step) {
        const int w = static_cast<int>(step % workers);
        pb::KvEventBatch add = batch(w, next[w], per_batch, true);
        pb::KvEventBatch drop = batch(w, next[w] - kHeld, per_batch, false);
        add.set_seq(++seq[w]);
        drop.set_seq(++seq[w]);
        next[w] += per_batch;
        ahead.emplace_back(w, add.SerializeAsString(), drop.SerializeAsString());
      }
      at = 0;
      state.ResumeTiming();
    }
    const auto& [w, add, drop] = ahead[at++];
    take(w, add);
    take(w, drop);
  }
  state.SetItemsProcessed(2 * state.iterations() * per_batch);
  size_t entries = 0;
  for (int w = 0; w < workers; ++w) entries += index.num_blocks(w);
  state.counters["entries"] = static_cast<double>(entries);
}
BENCHMARK(BM_ParseAndApplyFleet)
    ->ArgNames({"per_batch", "workers"})
    ->Args({8, 256})
    ->Args({256, 256});

// Batches as they come off the wire: state.range(0) blocks stored per batch, each block its own
// KvEvent (state.range(1) == 0, as workers wrote them before 2026-12-06) or one KvEvent for all
// (1); parsed and applied, and removed again 100K blocks later, as in BM_ApplyEvents.
void BM_ParseAndApply(benchmark::State& state) {
  const int per_batch = static_cast<int>(state.range(0));
  const bool grouped = state.range(1) != 0;
  const int kHeld = 100000 / per_batch, kRing = 2 * kHeld;
  std::mt19937_64 rng(4);
  std::vector<std::string> stored, removed;
  for (int i = 0; i < kRing; ++i) {
    std::vector<BlockHash> hashes;
    for (int j = 0; j < per_batch; ++j) hashes.push_back(RandomHash(rng));
    for (const bool store : {true, false}) {
      pb::KvEventBatch b;
      if (grouped) {
        b = Batch(hashes, store);
      } else {
        for (const BlockHash& h : hashes) b.MergeFrom(Batch({h}, store));
      }
      b.set_instance_id(1);
      (store ? stored : removed).push_back(b.SerializeAsString());
    }
  }
  PrefixIndex index;
  index.SetCapacity(0, static_cast<size_t>(per_batch) * kRing);
  uint64_t seq = 0;
  int64_t step = 0;
  pb::KvEventBatch received;
  const auto take = [&](const std::string& wire) {
    received.ParseFromString(wire);
    received.set_seq(++seq);
    benchmark::DoNotOptimize(index.ApplyEvents(0, received));
  };
  for (auto _ : state) {
    take(stored[step % kRing]);
    if (step >= kHeld) take(removed[(step - kHeld) % kRing]);
    ++step;
  }
  state.SetItemsProcessed(2 * state.iterations() * per_batch);
  state.SetBytesProcessed(state.iterations() *
                          static_cast<int64_t>(stored[0].size() + removed[0].size()));
}
BENCHMARK(BM_ParseAndApply)->Args({8, 0})->Args({8, 1})->Args({256, 0})->Args({256, 1});

// A restarted router rebuilding its index from every worker's snapshot: state.range(0) workers
// of state.range(1) blocks each, each snapshot parsed from its wire bytes and its table built on
// state.range(2) threads, kMaxPendingSnapshots at a time, then installed, as WorkerPool does
// when the snapshots arrive together (their transfer is not counted). Issue 59's goal: <= 5 s
// at 256 workers x 100K blocks.
void BM_RebuildFromSnapshots(benchmark::State& state) {
  const int workers = static_cast<int>(state.range(0));
  const int blocks = static_cast<int>(state.range(1));
  const int threads = static_cast<int>(state.range(2));
  constexpr int kDistinct = 4;   // snapshots of different blocks, dealt to the workers in turn
  constexpr int kTogether = 32;  // WorkerPool's kMaxPendingSnapshots
  std::mt19937_64 rng(5);
  std::vector<std::string> wire(kDistinct);
  for (std::string& w : wire) {
    pb::KvSnapshot snap;
    snap.set_instance_id(1);
    snap.set_seq(1);
    for (int i = 0; i < blocks; ++i) {
      pb::CachedBlock* b = snap.add_blocks();
      b->set_block_hash(RandomHash(rng).ToBytes());
      b->set_medium(pb::MEDIUM_DEVICE);
    }
    w = snap.SerializeAsString();
  }
  size_t entries = 0;
  for (auto _ : state) {
    PrefixIndex index;
    for (int first = 0; first < workers; first += kTogether) {
      std::vector<SnapshotJob> jobs;
      for (int w = first; w < std::min(workers, first + kTogether); ++w) {
        index.SetCapacity(w, blocks);
        jobs.push_back({w, wire[w % kDistinct], index.capacity(w)});
      }
      for (BuiltSnapshot& built : BuildSnapshots(jobs, threads)) {
        index.InstallSnapshot(built.worker, *std::move(built.table));
      }
    }
    entries = 0;
    for (int w = 0; w < workers; ++w) entries += index.num_blocks(w);
    state.PauseTiming();  // freeing the index is not part of the rebuild
    index = PrefixIndex();
    state.ResumeTiming();
  }
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(entries));
  state.counters["entries"] = static_cast<double>(entries);
  state.counters["snapshot_MB"] = static_cast<double>(wire[0].size()) / 1e6;
}
BENCHMARK(BM_RebuildFromSnapshots)
    ->ArgNames({"workers", "blocks", "threads"})
    ->Args({256, 100000, 1})
    ->Args({256, 100000, 2})
    ->Args({1024, 25000, 1})
    ->Args({1024, 25000, 2})
    ->Iterations(1)
    ->UseRealTime()
    ->Unit(benchmark::kSecond);

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

// A fleet's index: `workers` workers of 16K blocks each, worker w holding the first half of every
// prompt p with p % workers == w (and random blocks to fill its pool); kFleetPrompts prompts of
// 64 blocks in turn, so that lookups reach all over the index, as new conversations do.
constexpr int kFleetBlocks = 64, kFleetPool = 16 << 10, kFleetPrompts = 4096;

struct Fleet {
  std::vector<std::vector<BlockHash>> prompts;
  std::vector<int> ids;
  PrefixIndex index;
};

void BuildFleet(int workers, Fleet& fleet) {
  std::mt19937_64 rng(6);
  fleet.prompts.resize(kFleetPrompts);
  for (auto& prompt : fleet.prompts) {
    for (int i = 0; i < kFleetBlocks; ++i) prompt.push_back(RandomHash(rng));
  }
  for (int w = 0; w < workers; ++w) {
    fleet.ids.push_back(w);
    std::vector<BlockHash> held;
    for (int p = w % kFleetPrompts; p < kFleetPrompts; p += workers) {
      held.insert(held.end(), fleet.prompts[p].begin(),
                  fleet.prompts[p].begin() + kFleetBlocks / 2);
    }
    while (held.size() < static_cast<size_t>(kFleetPool)) held.push_back(RandomHash(rng));
    fleet.index.SetCapacity(w, held.size());
    pb::KvEventBatch b = Batch(held, true);
    b.set_seq(1);
    fleet.index.ApplyEvents(w, b);
  }
}

// A placement's lookups at fleet scale: a prompt looked up on every one of state.range(0)
// workers, as the cost policy asks them all; worker by worker with LongestPrefix
// (state.range(1) == 0) or all at once with LongestPrefixes (1), which fetches the workers'
// entries ahead.
void BM_PlaceFleet(benchmark::State& state) {
  const int workers = static_cast<int>(state.range(0));
  const bool batched = state.range(1) != 0;
  Fleet fleet;
  BuildFleet(workers, fleet);
  size_t next = 0;
  for (auto _ : state) {
    const std::vector<BlockHash>& prompt = fleet.prompts[next++ % kFleetPrompts];
    if (batched) {
      benchmark::DoNotOptimize(fleet.index.LongestPrefixes(fleet.ids, prompt));
    } else {
      std::vector<PrefixIndex::Match> matches(workers);
      for (int w = 0; w < workers; ++w) matches[w] = fleet.index.LongestPrefix(w, prompt);
      benchmark::DoNotOptimize(matches);
    }
  }
  state.SetItemsProcessed(state.iterations() * workers);  // workers asked
}
BENCHMARK(BM_PlaceFleet)->ArgNames({"workers", "batched"})->ArgsProduct({{256, 1024}, {0, 1}});

// A whole placement at fleet scale, as kvserve-router's placer makes it: the cost policy over
// state.range(0) workers' views (uneven load) and the fleet's index, with peer fetch weighed in
// (state.range(1) == 1: FetchOffers first, as --kv-fetch does) or not. Placements a second.
void BM_RouteFleet(benchmark::State& state) {
  const int workers = static_cast<int>(state.range(0));
  const bool fetch = state.range(1) != 0;
  Fleet fleet;
  BuildFleet(workers, fleet);
  std::vector<WorkerView> views(workers);
  for (int w = 0; w < workers; ++w) {
    WorkerView& v = views[w];
    v.id = w;
    v.name = "w" + std::to_string(w);
    v.block_size = 16;
    v.capacity_blocks = kFleetPool;
    v.active_blocks = (w * 37) % kFleetPool;
    v.queued_prefill_tokens = (w * 101) % 4000;
    v.decode_seqs = w % 32;
    v.kv_wire_block_bytes = 1 << 16;
    v.prefill_tokens_per_second = 15000;
  }
  absl::StatusOr<std::unique_ptr<RoutingPolicy>> policy =
      MakeRoutingPolicy(RoutingConfig{.policy = "cost", .seed = 1});
  if (!policy.ok()) {
    state.SkipWithError(policy.status().ToString().c_str());
    return;
  }
  const KvFetchConfig config{.enabled = true};
  size_t next = 0;
  for (auto _ : state) {
    const std::vector<BlockHash>& prompt = fleet.prompts[next++ % kFleetPrompts];
    const std::vector<FetchOffer> offers =
        fetch ? FetchOffers(config, 1.0, views, fleet.index, prompt) : std::vector<FetchOffer>{};
    const RouteRequest request{.hashes = prompt,
                               .prompt_tokens = kFleetBlocks * 16,
                               .max_tokens = 128,
                               .fetch_offers = offers};
    benchmark::DoNotOptimize(Route(**policy, views, fleet.index, request));
  }
  state.SetItemsProcessed(state.iterations());  // placements
}
BENCHMARK(BM_RouteFleet)->ArgNames({"workers", "fetch"})->ArgsProduct({{256, 1024}, {0, 1}});

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
  // The heap in use, and the tables mapped on huge pages apart from it (common/huge_pages.h).
  const auto in_use = [] { return mallinfo2().uordblks + HugeMappedBytes(); };
  for (auto _ : state) {
    const size_t before = in_use();
    {
      PrefixIndex index;
      for (int w = 0; w < kWorkers; ++w) {
        index.SetCapacity(w, per_worker);
        index.ApplyEvents(w, batches[w]);
      }
      bytes_per_entry =
          static_cast<double>(in_use() - before) / (static_cast<double>(per_worker) * kWorkers);
    }
  }
  state.counters["bytes_per_entry"] = bytes_per_entry;
}
BENCHMARK(BM_BytesPerEntry)->Arg(10000)->Arg(100000)->Iterations(1);

}  // namespace
}  // namespace kvserve::router

BENCHMARK_MAIN();
