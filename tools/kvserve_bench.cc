// kvserve-bench: benchmarks. `kvserve-bench quality` is the KV-quantization quality harness
// (tools/bench/kv_quality.h); the serving load generator joins it with the router.
//
//   kvserve-bench quality --model DIR [--tokens 2048] [--json]
#include <iostream>
#include <string>

#include "absl/flags/flag.h"
#include "common/hf_config.h"
#include "common/init.h"
#include "nlohmann/json.hpp"
#include "tools/bench/kv_quality.h"

ABSL_FLAG(std::string, model, "", "Model directory");
ABSL_FLAG(int32_t, tokens, 2048, "quality: teacher-forced stream length");
ABSL_FLAG(uint64_t, seed, 1, "quality: seed of the sampled stream");
ABSL_FLAG(int32_t, group_size, 32,
          "quality: channels per group for the per-group modes (capped at head_dim / 2)");
ABSL_FLAG(int32_t, decode_batch, 8, "quality: sequences in the decode timing");
ABSL_FLAG(int32_t, decode_context, 512, "quality: context per sequence in the decode timing");
ABSL_FLAG(int32_t, decode_steps, 32, "quality: timed decode steps (0: skip)");
ABSL_FLAG(bool, json, false, "Print JSON instead of the table");

namespace kvserve {
namespace {

int Quality() {
  bench::QualityOptions o;
  o.model_dir = absl::GetFlag(FLAGS_model);
  if (o.model_dir.empty()) {
    std::cerr << "kvserve-bench quality: --model DIR is required\n";
    return 2;
  }
  o.num_tokens = absl::GetFlag(FLAGS_tokens);
  o.seed = absl::GetFlag(FLAGS_seed);
  o.decode_batch = absl::GetFlag(FLAGS_decode_batch);
  o.decode_context = absl::GetFlag(FLAGS_decode_context);
  o.decode_steps = absl::GetFlag(FLAGS_decode_steps);
  absl::StatusOr<ModelConfig> mc = LoadHfConfig(o.model_dir);
  if (!mc.ok()) {
    std::cerr << "kvserve-bench quality: " << mc.status().message() << "\n";
    return 1;
  }
  const int group = std::max(8, std::min(absl::GetFlag(FLAGS_group_size), mc->head_dim / 2));
  auto rows = bench::MeasureKvQuality(o, bench::DefaultKvModes(group));
  if (!rows.ok()) {
    std::cerr << "kvserve-bench quality: " << rows.status().message() << "\n";
    return 1;
  }
  if (absl::GetFlag(FLAGS_json)) {
    for (const auto& q : *rows) {
      std::cout << nlohmann::json{{"mode", q.name},
                                  {"format", q.format},
                                  {"kv_bytes_per_token", q.kv_bytes_per_token},
                                  {"memory_vs_fp16", q.memory_vs_fp16},
                                  {"top1_agreement", q.top1_agreement},
                                  {"mean_kl", q.mean_kl},
                                  {"perplexity", q.perplexity},
                                  {"perplexity_ratio", q.perplexity_ratio},
                                  {"decode_us_per_token", q.decode_us_per_token}}
                       .dump()
                << "\n";
    }
  } else {
    std::cout << "model " << o.model_dir << ", " << o.num_tokens
              << " teacher-forced tokens, per-group size " << group << ", decode timing "
              << o.decode_batch << " x " << o.decode_context << " tokens\n"
              << bench::FormatQualityTable(*rows);
  }
  return 0;
}

}  // namespace
}  // namespace kvserve

int main(int argc, char** argv) {
  std::vector<char*> args = kvserve::InitProgram(
      argc, argv,
      "kvserve-bench quality --model DIR [--tokens N] [--json]: KV quantization quality");
  if (args.size() < 2 || std::string(args[1]) != "quality") {
    std::cerr << "kvserve-bench: give a command: quality\n";
    return 2;
  }
  return kvserve::Quality();
}
