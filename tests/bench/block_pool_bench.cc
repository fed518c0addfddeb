// Block bookkeeping costs: allocate + release, prefix lookup, and a sequence's full-block
// allocation through the KV cache manager.
#include <random>

#include "benchmark/benchmark.h"
#include "worker/kv_cache/kv_cache_manager.h"

namespace kvserve::worker {
namespace {

void BM_AllocateRelease(benchmark::State& state) {
  BlockPool pool(static_cast<int>(state.range(0)));
  std::vector<int> held;
  held.reserve(state.range(0));
  for (auto _ : state) {
    for (int i = 0; i < 64; ++i) held.push_back(*pool.Allocate());
    for (auto it = held.rbegin(); it != held.rend(); ++it) pool.Release(*it);
    held.clear();
  }
  state.SetItemsProcessed(state.iterations() * 64);
}
BENCHMARK(BM_AllocateRelease)->Arg(1024)->Arg(65536);

void BM_CachedLookup(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  BlockPool pool(n);
  std::vector<BlockHash> hashes;
  for (int i = 0; i < n; ++i) {
    int b = *pool.Allocate();
    BlockHash h{static_cast<uint64_t>(i) * 0x9e3779b97f4a7c15ULL, static_cast<uint64_t>(i)};
    pool.Cache(b, h);
    hashes.push_back(h);
  }
  std::mt19937 rng(1);
  for (auto _ : state) {
    benchmark::DoNotOptimize(pool.Lookup(hashes[rng() % n]));
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_CachedLookup)->Arg(1024)->Arg(65536);

// A 2,048-token sequence: allocate its blocks, register their hashes, free them (cached).
void BM_SequenceAllocateCacheFree(benchmark::State& state) {
  const int block_size = 16, tokens = 2048;
  KvCacheManager kv({.num_blocks = 4096, .block_size = block_size, .enable_prefix_caching = true});
  Sequence seq;
  seq.tokens.assign(tokens, 1);
  seq.num_prompt_tokens = tokens;
  for (int b = 0; b < tokens / block_size; ++b)
    seq.block_hashes.push_back(BlockHash{uint64_t(b) + 1, 7});
  for (auto _ : state) {
    seq.num_computed_tokens = 0;
    std::vector<CachedBlock> hit = kv.FindCachedBlocks(seq);
    kv.Allocate(seq, tokens - static_cast<int>(hit.size()) * block_size, hit);
    seq.num_computed_tokens = tokens;
    kv.CacheComputedBlocks(seq);
    kv.Free(seq);
  }
  state.SetItemsProcessed(state.iterations() * (tokens / block_size));
}
BENCHMARK(BM_SequenceAllocateCacheFree);

}  // namespace
}  // namespace kvserve::worker

BENCHMARK_MAIN();
