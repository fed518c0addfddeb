// What a structured-outputs mask costs per step without a cache: one walk of the vocabulary
// trie with the automaton, from a state where most tokens are allowed (inside a JSON string)
// and from one where few are (a digit, or a literal), on the vocabulary of --tokenizer; and
// the one-off costs: compiling the pattern, building the trie.
//
//   token_mask_bench --tokenizer=DIR [--benchmark_* flags]
#include <cstring>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
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
