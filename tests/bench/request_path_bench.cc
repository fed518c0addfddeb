// What a completion of token ids costs the router per id, apart from its system calls and the
// prefix index (prefix_index_bench): its body parsed (frontend/request/openai_request.h), its
// block hashes (common/kv/block_hash.h), and its ids put into the GenerateRequest the worker
// gets, the way the front end does it now beside the way it did, side by side in one run.
// Recorded in docs/ROUTING.md; never timed in tests.
//
//   build/bin/request_path_bench
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "benchmark/benchmark.h"
#include "common/kv/block_hash.h"
#include "frontend/request/openai_request.h"
#include "kvserve/v1/kvserve.pb.h"

namespace kvserve::frontend {
namespace {

std::vector<int> RandomIds(int n) {
  std::mt19937 rng(1);
  std::uniform_int_distribution<int> id(0, 128255);
  std::vector<int> ids(n);
  for (int& i : ids) i = id(rng);
  return ids;
}

// A /v1/completions body of state.range(0) token ids, parsed as the front end parses it.
void BM_ParseIdsBody(benchmark::State& state) {
  const std::vector<int> ids = RandomIds(static_cast<int>(state.range(0)));
  const std::string body = absl::StrCat(R"({"model": "m", "prompt": [)", absl::StrJoin(ids, ","),
                                        R"(], "max_tokens": 4, "stream": true})");
  RequestLimits limits;
  limits.max_prompt_ids = 1 << 20;
  for (auto _ : state) {
    absl::StatusOr<ParsedRequest> r = ParseCompletionRequest(body, /*chat=*/false, limits);
    if (!r.ok() || r->prompts.at(0).ids.size() != ids.size()) {
      state.SkipWithError("the body did not parse");
      break;
    }
    benchmark::DoNotOptimize(r);
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(body.size()));
}
BENCHMARK(BM_ParseIdsBody)->ArgName("ids")->Arg(1000)->Arg(14000);

// The prompt's block hashes, as the placer computes them (16-token blocks).
void BM_HashIds(benchmark::State& state) {
  const std::vector<int> ids = RandomIds(static_cast<int>(state.range(0)));
  const std::vector<uint32_t> tokens(ids.begin(), ids.end());
  for (auto _ : state) benchmark::DoNotOptimize(HashFullBlocks(tokens, 16, ""));
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_HashIds)->ArgName("ids")->Arg(1000)->Arg(14000);

// The prompt's ids into a GenerateRequest: state.range(1) = 1 in one copy (Assign, as the front
// end does now), 0 one id at a time (as it did: the field grew by doubling).
void BM_RequestIds(benchmark::State& state) {
  const std::vector<int> ids = RandomIds(static_cast<int>(state.range(0)));
  for (auto _ : state) {
    kvserve::v1::GenerateRequest g;
    if (state.range(1) != 0) {
      g.mutable_prompt_token_ids()->Assign(ids.begin(), ids.end());
    } else {
      for (int id : ids) g.add_prompt_token_ids(id);
    }
    benchmark::DoNotOptimize(g);
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_RequestIds)
    ->ArgNames({"ids", "assign"})
    ->Args({1000, 0})
    ->Args({1000, 1})
    ->Args({14000, 0})
    ->Args({14000, 1});

}  // namespace
}  // namespace kvserve::frontend

BENCHMARK_MAIN();
