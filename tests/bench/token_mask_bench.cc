// What a structured-outputs mask costs per step without a cache: one walk of the vocabulary
// trie with the automaton, from a state where most tokens are allowed (inside a JSON string)
// and from one where few are (a digit, or a literal), on the vocabulary of --tokenizer; and
// the one-off costs: compiling the pattern, building the trie. For a nested JSON schema (a
// grammar): the walk from a matcher that has seen the state before and from a fresh one, the
// compile time, and per-step mask times over simulated generations with the worker's per-state
// cache (p50 / p99 / max in the counters).
//
//   token_mask_bench --tokenizer=DIR [--benchmark_* flags]
#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "benchmark/benchmark.h"
#include "common/structured/grammar.h"
#include "common/structured/json_schema.h"
#include "common/structured/regex.h"
#include "common/structured/token_mask.h"
#include "common/tokenizer/tokenizer.h"

namespace {

using kvserve::structured::CompileRegex;
using kvserve::structured::Dfa;
using kvserve::structured::TokenTrie;

std::string g_tokenizer_dir;

const std::vector<std::string>& Vocab() {
  static const std::vector<std::string> vocab = [] {
    auto tok = kvserve::tokenizer::Tokenizer::FromDirectory(g_tokenizer_dir);
    return tok.ok() ? kvserve::structured::VocabularyBytes(**tok) : std::vector<std::string>();
  }();
  return vocab;
}

const TokenTrie& Trie() {
  static const TokenTrie trie(Vocab());
  return trie;
}

// A JSON object with a free-text field, a number and an enum.
constexpr const char* kPattern =
    R"re(\{"name": "([^"\\]|\\["\\/bfnrt]){1,64}", "age": (0|[1-9][0-9]{0,2}), )re"
    R"re("role": "(admin|user|guest)"\})re";

// The mask at the state after `prefix`.
void Mask(benchmark::State& state, const char* prefix) {
  if (Vocab().empty()) return state.SkipWithError("no tokenizer at --tokenizer");
  const Dfa dfa = *CompileRegex(kPattern);
  const Dfa::State s = dfa.Walk(dfa.start(), prefix);
  int32_t allowed = 0;
  for (auto _ : state) {
    auto mask = Trie().Allowed(dfa, s);
    allowed = mask.Count();
    benchmark::DoNotOptimize(mask);
  }
  state.counters["allowed"] = allowed;
  state.counters["vocab"] = Trie().vocab_size();
}

void BM_MaskInString(benchmark::State& state) { Mask(state, R"({"name": "Ada)"); }
void BM_MaskInNumber(benchmark::State& state) { Mask(state, R"({"name": "Ada", "age": 3)"); }
void BM_MaskInLiteral(benchmark::State& state) { Mask(state, R"({"name": "Ada", "age": 36, "ro)"); }

void BM_CompilePattern(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(CompileRegex(kPattern));
}

void BM_BuildTrie(benchmark::State& state) {
  if (Vocab().empty()) return state.SkipWithError("no tokenizer at --tokenizer");
  for (auto _ : state) {
    TokenTrie trie(Vocab());
    state.counters["nodes"] = trie.num_nodes();
  }
}

// A customer record: nested objects, arrays of objects, bounded and free strings, numbers.
constexpr const char* kSchema = R"({"type": "object", "properties": {
  "id": {"type": "integer", "minimum": 0},
  "name": {"type": "string", "maxLength": 40},
  "address": {"type": "object", "properties": {"street": {"type": "string", "maxLength": 60},
    "city": {"type": "string", "maxLength": 30}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
    "required": ["street", "city"]},
  "tags": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 8},
  "orders": {"type": "array", "maxItems": 5, "items": {"type": "object", "properties": {
    "sku": {"type": "string", "maxLength": 12}, "qty": {"type": "integer", "minimum": 1, "maximum": 100},
    "price": {"type": "number"}, "state": {"enum": ["new", "paid", "shipped"]}},
    "required": ["sku", "qty"]}}},
  "required": ["id", "name", "address"]})";

std::shared_ptr<const kvserve::structured::Grammar> SchemaGrammar() {
  static const auto g = std::make_shared<const kvserve::structured::Grammar>(
      *kvserve::structured::CompileJsonSchema(kSchema));
  return g;
}

constexpr const char* kInName = R"({"id": 7, "name": "Ada)";

void BM_SchemaMaskInStringWarm(benchmark::State& state) {
  if (Vocab().empty()) return state.SkipWithError("no tokenizer at --tokenizer");
  kvserve::structured::GrammarMatcher m(SchemaGrammar());
  const auto s = m.Walk(m.start(), kInName);
  int32_t allowed = Trie().Allowed(m, s).Count();
  for (auto _ : state) benchmark::DoNotOptimize(Trie().Allowed(m, s));
  state.counters["allowed"] = allowed;
}

void BM_SchemaMaskInStringCold(benchmark::State& state) {
  if (Vocab().empty()) return state.SkipWithError("no tokenizer at --tokenizer");
  for (auto _ : state) {
    kvserve::structured::GrammarMatcher m(SchemaGrammar());
    benchmark::DoNotOptimize(Trie().Allowed(m, m.Walk(m.start(), kInName)));
  }
}

void BM_CompileSchema(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(kvserve::structured::CompileJsonSchema(kSchema));
}

// Generations of uniformly drawn allowed tokens (what random weights at temperature 1 come
// close to), the mask of each step from a per-state cache as in worker/constraints.cc: the
// per-step times over all of them.
void BM_SchemaStepsWithCache(benchmark::State& state) {
  using kvserve::structured::GrammarMatcher;
  using kvserve::structured::TokenMask;
  if (Vocab().empty()) return state.SkipWithError("no tokenizer at --tokenizer");
  std::vector<double> step_us;
  int64_t misses = 0;
  for (auto _ : state) {
    GrammarMatcher m(SchemaGrammar());
    absl::flat_hash_map<GrammarMatcher::State, std::shared_ptr<const TokenMask>> cache;
    std::mt19937 rng(1);
    for (int seq = 0; seq < static_cast<int>(state.range(0)); ++seq) {
      GrammarMatcher::State s = m.start();
      for (int step = 0; step < 300 && s != GrammarMatcher::kDead && m.has_next(s); ++step) {
        const auto t0 = std::chrono::steady_clock::now();
        auto it = cache.find(s);
        if (it == cache.end()) {
          ++misses;
          it = cache.emplace(s, std::make_shared<TokenMask>(Trie().Allowed(m, s))).first;
        }
        const TokenMask& mask = *it->second;
        step_us.push_back(
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                .count());
        std::vector<int32_t> allowed;
        for (int32_t id = 0; id < Trie().vocab_size(); ++id) {
          if (mask.Has(id)) allowed.push_back(id);
        }
        if (allowed.empty()) break;
        s = m.Walk(s, Vocab()[allowed[rng() % allowed.size()]]);
      }
    }
  }
  std::sort(step_us.begin(), step_us.end());
  auto at = [&](double q) { return step_us[static_cast<size_t>(q * (step_us.size() - 1))]; };
  state.counters["steps"] = static_cast<double>(step_us.size());
  state.counters["miss_rate"] = static_cast<double>(misses) / step_us.size();
  state.counters["p50_us"] = at(0.5);
  state.counters["p99_us"] = at(0.99);
  state.counters["max_us"] = step_us.back();
}

BENCHMARK(BM_SchemaMaskInStringWarm)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_SchemaMaskInStringCold)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_CompileSchema)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_SchemaStepsWithCache)->Arg(32)->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MaskInString)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_MaskInNumber)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_MaskInLiteral)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_CompilePattern)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_BuildTrie)->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--tokenizer=", 12) == 0) g_tokenizer_dir = argv[i] + 12;
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  return 0;
}
