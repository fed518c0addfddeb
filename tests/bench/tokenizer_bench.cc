// Encode throughput of kvserve's tokenizer, single thread, over a corpus of JSON-lines
// strings ({"text": ...}); tests/bench/tokenizer_bench.sh runs it beside Hugging Face
// `tokenizers` on the same corpus.
//
//   tokenizer_bench --tokenizer=DIR --corpus=FILE [--benchmark_* flags]
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "common/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"

namespace {

std::string g_tokenizer_dir;
std::vector<std::string> g_corpus;

void BM_Encode(benchmark::State& state) {
  static auto tok = kvserve::tokenizer::Tokenizer::FromDirectory(g_tokenizer_dir);
  if (!tok.ok()) {
    state.SkipWithError(std::string(tok.status().message()).c_str());
    return;
  }
  int64_t bytes = 0, tokens = 0;
  for (auto _ : state) {
    for (const std::string& s : g_corpus) {
      auto ids = (*tok)->Encode(s, /*add_special_tokens=*/true);
      tokens += static_cast<int64_t>(ids->size());
      bytes += static_cast<int64_t>(s.size());
      benchmark::DoNotOptimize(ids);
    }
  }
  state.SetBytesProcessed(bytes);
  state.counters["tokens_per_s"] =
      benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsRate);
  state.counters["strings"] = static_cast<double>(g_corpus.size());
}
BENCHMARK(BM_Encode)->Unit(benchmark::kMillisecond)->MinTime(3.0);

}  // namespace

int main(int argc, char** argv) {
  std::string corpus_path;
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--tokenizer=", 12) == 0) {
      g_tokenizer_dir = argv[i] + 12;
    } else if (std::strncmp(argv[i], "--corpus=", 9) == 0) {
      corpus_path = argv[i] + 9;
    } else {
      rest.push_back(argv[i]);
    }
  }
  std::ifstream in(corpus_path);
  if (g_tokenizer_dir.empty() || !in) {
    std::cerr << "usage: tokenizer_bench --tokenizer=DIR --corpus=FILE.jsonl\n";
    return 2;
  }
  for (std::string line; std::getline(in, line);) {
    g_corpus.push_back(nlohmann::json::parse(line)["text"].get<std::string>());
  }
  int rest_argc = static_cast<int>(rest.size());
  benchmark::Initialize(&rest_argc, rest.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
