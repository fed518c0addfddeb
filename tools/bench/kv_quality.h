// The KV-quantization quality harness behind `kvserve-bench quality`: for each KV mode, run a
// token stream teacher-forced through the engine and compare the logits at every position with
// the float32 cache's: top-1 agreement, mean KL divergence, perplexity ratio; plus the mode's
// KV bytes per token and its decode time per token.
//
//   ASSIGN_OR_RETURN(std::vector<ModeQuality> rows, MeasureKvQuality(options, DefaultKvModes(16)));
#ifndef KVSERVE_TOOLS_BENCH_KV_QUALITY_H_
#define KVSERVE_TOOLS_BENCH_KV_QUALITY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/kv/kv_format.h"

namespace kvserve::bench {

struct KvMode {
  std::string name;
  KvQuantOptions quant;
};

// FP32 (reference), FP16, BF16, FP8, INT8 per-token / per-group / per-channel-K, INT4
// per-token / per-group / per-channel-K + per-token-V, and INT4 per-group with the first and
// last layers at full precision. `group_size` is used for the per-group modes.
std::vector<KvMode> DefaultKvModes(int group_size);

struct QualityOptions {
  std::string model_dir;
  int num_tokens = 2048;  // teacher-forced stream length
  uint64_t seed = 1;
  int decode_batch = 8;  // decode timing: sequences
  int decode_context = 512;
  int decode_steps = 32;
  int block_size = 16;
};

struct ModeQuality {
  std::string name;
  std::string format;  // KvCacheSpec description
  double kv_bytes_per_token = 0;
  double memory_vs_fp16 = 0;
  double top1_agreement = 0;  // vs the fp32 cache
  double mean_kl = 0;         // KL(fp32 || mode), nats per position
  double perplexity = 0;
  double perplexity_ratio = 0;  // vs the fp32 cache
  double decode_us_per_token = 0;
};

// The stream is sampled from the model itself (temperature 1, `seed`), so it is text the model
// finds plausible, then fed back as one prompt in every mode.
absl::StatusOr<std::vector<ModeQuality>> MeasureKvQuality(const QualityOptions& options,
                                                          const std::vector<KvMode>& modes);

// The table the write-ups print, as text.
std::string FormatQualityTable(const std::vector<ModeQuality>& rows);

}  // namespace kvserve::bench

#endif  // KVSERVE_TOOLS_BENCH_KV_QUALITY_H_
