#include "tools/bench/engine_bench.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/model/model_weights.h"
#include "common/status_macros.h"
#include "kernels/backend.h"
#include "worker/engine.h"
#include "worker/model/step_profile.h"

namespace kvserve::bench {
namespace {

using worker::AttentionKernel;
using worker::Device;
using worker::Engine;
using worker::EngineConfig;
using worker::ParseAttentionKernel;
using worker::ParseDevice;
using worker::ParseWeightDtype;
using worker::RequestInput;
using worker::WeightDtype;

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// Device-to-device copy bandwidth of `backend` (read + write), on buffers of `bytes`, or of a
// quarter of the device's free memory where that is less (a small or emulated device).
double CopyGbps(kernels::Backend& backend, size_t bytes) {
  size_t free = 0, total = 0;
  if (backend.MemoryInfo(&free, &total)) bytes = std::max<size_t>(std::min(bytes, free / 4), 1);
  void* a = backend.Allocate(2 * bytes);
  auto* src = static_cast<uint8_t*>(a);
  backend.Copy(src + bytes, src, bytes);  // first touch
  backend.Synchronize();
  constexpr int kIters = 8;
  const Clock::time_point start = Clock::now();
  for (int i = 0; i < kIters; ++i) backend.Copy(src + bytes, src, bytes);
  backend.Synchronize();
  const double s = Seconds(start);
  backend.Free(a);
  return 2.0 * static_cast<double>(bytes) * kIters / s / 1e9;
}

absl::Status CheckOptions(const EngineBenchOptions& o) {
  if (o.model_dir.empty()) return absl::InvalidArgumentError("--model DIR is required");
  if (o.kv_cache_dtypes.empty() || o.batches.empty() || o.contexts.empty() ||
      o.cuda_graph_max_batches.empty() || o.decode_gemv_max_batches.empty()) {
    return absl::InvalidArgumentError(
        "--kv-cache-dtypes, --batches, --contexts, --cuda-graph-max-batch and "
        "--decode-gemv-max-batch each need at least one value");
  }
  for (int b : o.batches) {
    if (b < 1) return absl::InvalidArgumentError(absl::StrCat("--batches has ", b, "; use >= 1"));
  }
  for (int c : o.contexts) {
    if (c < 1) return absl::InvalidArgumentError(absl::StrCat("--contexts has ", c, "; use >= 1"));
  }
  if (o.async_scheduling.empty()) {
    return absl::InvalidArgumentError("--async needs at least one value");
  }
  for (const std::string& a : o.async_scheduling) {
    if (a != "auto" && a != "on" && a != "off") {
      return absl::InvalidArgumentError(absl::StrCat("--async has '", a, "'; use auto, on or off"));
    }
  }
  if (o.warmup_steps < 0 || o.decode_steps < 1) {
    return absl::InvalidArgumentError("--warmup-steps must be >= 0 and --decode-steps >= 1");
  }
  return absl::OkStatus();
}

// Output tokens a request needs so that it never finishes inside the timed window: the
// decode steps, plus one per prefill step in which it may already decode while others
// prefill (chunked prefill: the sequences decoding take up to `batch` of each step's tokens),
// plus the prefill's own token.
int MaxTokens(const EngineBenchOptions& o, int batch, int context) {
  const int64_t budget = std::max(o.max_num_batched_tokens, context);  // RunEngineBench's
  const int64_t prefill_tokens = std::max<int64_t>(1, budget - batch);
  const int64_t prefill_steps = (int64_t{batch} * context + prefill_tokens - 1) / prefill_tokens;
  return static_cast<int>(prefill_steps) + o.warmup_steps + o.decode_steps + 2;
}

// Counts the KV events the engine fires (a worker encodes and publishes each).
class EventCounter : public worker::KvEventListener {
 public:
  void OnKvEvent(const BlockHash& /*hash*/, bool /*stored*/, worker::Medium /*medium*/,
                 const worker::BlockContent* /*content*/) override {
    ++events_;
  }
  [[nodiscard]] int64_t events() const { return events_; }

 private:
  int64_t events_ = 0;
};

// The step profile's figures, µs per step, into `row`.
void AddHostTimes(const worker::StepProfile& p, double metrics_s, int64_t events,
                  EngineBenchRow& row) {
  const double steps = static_cast<double>(std::max<int64_t>(p.steps, 1));
  row.host_us_per_step = 1e6 * p.wall_seconds / steps;
  row.host_cpu_us_per_step = 1e6 * p.cpu_seconds / steps;
  for (double s : p.seconds.s) row.phase_us.push_back(1e6 * s / steps);
  row.metrics_us_per_step = 1e6 * metrics_s / steps;
  row.kv_events_per_step = static_cast<double>(events) / steps;
}

// `batch` requests of `context` random tokens, sampled as vLLM's defaults, never ending early.
absl::Status AddRequests(Engine& engine, int batch, int context, int max_tokens,
                         std::mt19937_64& rng) {
  const int vocab = engine.model_config().vocab_size;
  for (int i = 0; i < batch; ++i) {
    RequestInput in;
    in.request_id = absl::StrCat("bench-", batch, "x", context, "-", i);
    in.prompt.resize(context);
    for (int32_t& t : in.prompt) t = static_cast<int32_t>(rng() % vocab);
    in.max_tokens = max_tokens;
    in.sampling.temperature = 1.0f;  // vLLM's default sampling
    in.sampling.seed = rng();
    in.sampling.ignore_eos = true;
    RETURN_IF_ERROR(engine.AddRequest(std::move(in)));
  }
  return absl::OkStatus();
}

// The per-op device times of the window, µs and calls per step, largest first.
void AddOpTimes(const std::map<std::string, kernels::Backend::OpTime>& op_times, int steps,
                EngineBenchRow& row) {
  for (const auto& [op, t] : op_times) {
    row.op_us.push_back({op, 1e3 * t.ms / steps, static_cast<double>(t.count) / steps});
  }
  std::sort(row.op_us.begin(), row.op_us.end(),
            [](const auto& a, const auto& b) { return a.us_per_step > b.us_per_step; });
}

// One batch × context on `engine`: prefill, warm-up, timed decode; the requests are aborted
// at the end, leaving the pool empty for the next.
absl::StatusOr<EngineBenchRow> RunOne(Engine& engine, const EngineBenchOptions& o, int batch,
                                      int context, int64_t weight_bytes_read,
                                      std::mt19937_64& rng) {
  RETURN_IF_ERROR(AddRequests(engine, batch, context, MaxTokens(o, batch, context), rng));
  EngineBenchRow row;
  row.batch = batch;
  row.context = context;
  const int64_t prompt_tokens = int64_t{batch} * context;
  const int64_t computed_before = engine.stats().computed_prompt_tokens;
  Clock::time_point start = Clock::now();
  while (engine.stats().computed_prompt_tokens - computed_before < prompt_tokens) {
    RETURN_IF_ERROR(engine.Step().status());
  }
  row.prefill_s = Seconds(start);
  row.prefill_tokens_per_s = static_cast<double>(prompt_tokens) / row.prefill_s;

  // Every step of the warm-up and the timed window must decode the whole batch. One outputs
  // vector across steps, as the worker keeps it.
  std::vector<worker::SequenceOutput> outs;
  auto decode_step = [&]() -> absl::Status {
    RETURN_IF_ERROR(engine.StepInto(outs));
    int64_t tokens = 0;
    for (const auto& out : outs) tokens += static_cast<int64_t>(out.new_tokens.size());
    if (tokens != batch) {
      return absl::InternalError(
          absl::StrCat("a decode step at batch ", batch, " x ", context, " produced ", tokens,
                       " tokens, not one per sequence (one finished or was preempted)"));
    }
    return absl::OkStatus();
  };
  for (int s = 0; s < o.warmup_steps; ++s) RETURN_IF_ERROR(decode_step());
  const int64_t kv_tokens_before = engine.kv_usage().used_tokens;
  const int64_t graph_steps_before = engine.stats().graph_steps;
  EventCounter events;
  engine.SetKvEventListener(&events);
  kernels::Backend& device = engine.runner().backend(0);
  if (o.op_times) {
    device.TakeOpTimes();  // what ran before the window
    device.EnableOpTiming(true);
  }
  engine.EnableStepProfile(true);
  start = Clock::now();
  for (int s = 0; s < o.decode_steps; ++s) RETURN_IF_ERROR(decode_step());
  const double decode_s = Seconds(start);
  // Applied in the window (run ahead, the window's last step is applied after it).
  const int64_t graph_steps_after = engine.stats().graph_steps;
  const worker::StepProfile profile = engine.step_profile();
  engine.EnableStepProfile(false);
  std::map<std::string, kernels::Backend::OpTime> op_times;
  if (o.op_times) {
    op_times = device.TakeOpTimes();
    device.EnableOpTiming(false);
  }
  engine.SetKvEventListener(nullptr);
  // The metrics' read, timed apart so that the window above is the engine's alone.
  start = Clock::now();
  int64_t sink = 0;
  for (int s = 0; s < o.decode_steps; ++s) sink += engine.stats().num_running;
  const double metrics_s = Seconds(start);
  if (sink < 0) return absl::InternalError("negative running count");
  const int64_t kv_tokens_after = engine.kv_usage().used_tokens;
  engine.AbortAll();

  row.decode_ms_per_step = 1e3 * decode_s / o.decode_steps;
  row.decode_tokens_per_s = static_cast<double>(batch) * o.decode_steps / decode_s;
  // Step k of the window reads each sequence's tokens computed before the window, plus k + 1.
  const worker::EngineStats stats = engine.stats();
  row.graph_steps = static_cast<int>(graph_steps_after - graph_steps_before);
  const double kv_bytes_per_token =
      static_cast<double>(stats.kv_bytes_per_block) / engine.config().cache.block_size;
  row.step_kv_bytes =
      kv_bytes_per_token * 0.5 * static_cast<double>(kv_tokens_before + kv_tokens_after + batch);
  row.step_bytes = static_cast<double>(weight_bytes_read) + row.step_kv_bytes;
  row.gbps = row.step_bytes / (1e-3 * row.decode_ms_per_step) / 1e9;
  AddHostTimes(profile, metrics_s, events.events(), row);
  AddOpTimes(op_times, o.decode_steps, row);
  return row;
}

// The engine every row shares: sized for the largest batch × context of the run.
absl::StatusOr<EngineConfig> BaseConfig(const EngineBenchOptions& o) {
  const int max_context = *std::max_element(o.contexts.begin(), o.contexts.end());
  int64_t max_blocks = 0;
  int max_len = 0;
  for (int b : o.batches) {
    for (int c : o.contexts) {
      const int len = c + MaxTokens(o, b, c);
      max_len = std::max(max_len, len);
      max_blocks = std::max(max_blocks, int64_t{b} * ((len + o.block_size - 1) / o.block_size));
    }
  }
  EngineConfig c;
  ASSIGN_OR_RETURN(c.backend.device, ParseDevice(o.device));
  ASSIGN_OR_RETURN(c.dtype, ParseWeightDtype(o.dtype));
  ASSIGN_OR_RETURN(c.backend.attention_kernel, ParseAttentionKernel(o.attention_kernel));
  c.model_dir = o.model_dir;
  c.backend.cpu_threads = o.cpu_threads;
  c.cache.block_size = o.block_size;
  c.max_model_len = max_len;
  c.cache.enable_prefix_caching = o.prefix_caching;
  c.cache.num_blocks = static_cast<int>(max_blocks + 1);
  c.scheduler.max_num_seqs = *std::max_element(o.batches.begin(), o.batches.end());
  c.scheduler.max_num_batched_tokens = std::max(o.max_num_batched_tokens, max_context);
  return c;
}

}  // namespace

int64_t DecodeWeightBytes(const ModelConfig& config, int64_t weight_bytes) {
  if (config.tie_word_embeddings) return weight_bytes;  // the table is the LM head too
  const int64_t params = NumParams(config);
  const int64_t table = int64_t{config.vocab_size} * config.hidden_size;
  return static_cast<int64_t>(static_cast<double>(weight_bytes) *
                              static_cast<double>(params - table) / static_cast<double>(params));
}

absl::StatusOr<EngineBenchReport> RunEngineBench(const EngineBenchOptions& o) {
  RETURN_IF_ERROR(CheckOptions(o));
  RETURN_IF_ERROR(LoadHfConfig(o.model_dir).status());  // a bad --model, said as such
  ASSIGN_OR_RETURN(const EngineConfig base, BaseConfig(o));
  const Device device = base.backend.device;
  EngineBenchReport report;
  report.device = o.device;
  std::mt19937_64 rng(o.seed);
  // One engine per KV dtype and per variant: graphs, async scheduling, DecodeGemv.
  struct Variant {
    int graphs;
    std::string async;
    int gemv;
  };
  std::vector<Variant> variants;
  for (const int graphs : o.cuda_graph_max_batches) {
    for (const std::string& async : o.async_scheduling) {
      for (const int gemv : o.decode_gemv_max_batches) variants.push_back({graphs, async, gemv});
    }
  }
  for (const std::string& kv_dtype : o.kv_cache_dtypes) {
    for (const Variant& v : variants) {
      EngineConfig c = base;
      c.async_scheduling = v.async == "on"    ? worker::AsyncScheduling::kOn
                           : v.async == "off" ? worker::AsyncScheduling::kOff
                                              : worker::AsyncScheduling::kAuto;
      c.backend.cuda_graph_max_batch = v.graphs;
      c.backend.decode_gemv_max_batch = v.gemv;
      c.cache.kv_quant.dtype = kv_dtype;
      const Clock::time_point start = Clock::now();
      absl::StatusOr<std::unique_ptr<Engine>> made = Engine::Create(c);
      const double start_s = Seconds(start);
      if (!made.ok()) {
        return absl::Status(made.status().code(),
                            absl::StrCat("the engine with --kv-cache-dtype ", kv_dtype, ": ",
                                         made.status().message()));
      }
      std::unique_ptr<Engine> engine = *std::move(made);
      if (engine->async_scheduling() && o.warmup_steps < 1) {
        return absl::InvalidArgumentError(
            "--warmup-steps must be >= 1 with async scheduling (a step reports the one before "
            "it; --async off)");
      }
      if (report.copy_gbps == 0) {
        report.weight_bytes = engine->runner().weight_bytes(0);
        report.weight_bytes_read = DecodeWeightBytes(engine->model_config(), report.weight_bytes);
        // Large enough to leave the caches: 1 GiB on a GPU, 256 MiB on the CPU.
        report.copy_gbps = CopyGbps(engine->runner().backend(0),
                                    device == Device::kCuda ? size_t{1} << 30 : size_t{256} << 20);
      }
      for (int b : o.batches) {
        for (int ctx : o.contexts) {
          ASSIGN_OR_RETURN(EngineBenchRow row,
                           RunOne(*engine, o, b, ctx, report.weight_bytes_read, rng));
          row.kv_cache_dtype = kv_dtype;
          row.kv_format = engine->kv_spec().k[0].Describe();
          row.cuda_graph_max_batch = v.graphs;
          row.decode_gemv_max_batch = v.gemv;
          row.async_scheduling = engine->async_scheduling();
          row.start_s = start_s;
          row.graph_record_s = engine->graph_recording().seconds;
          row.graph_record_mib = engine->graph_recording().device_mib;
          row.fraction_of_copy = row.gbps / report.copy_gbps;
          if (o.on_row) o.on_row(row);
          report.rows.push_back(std::move(row));
        }
      }
    }
  }
  return report;
}

std::string FormatEngineBench(const EngineBenchReport& r) {
  std::string s = absl::StrFormat(
      "device %s: copy %.0f GB/s (read + write); weights %.1f MiB, %.1f MiB read per decode "
      "step\n%-8s %-22s %6s %7s %10s %12s %10s %11s %9s %8s %7s %6s %5s %4s %7s\n",
      r.device, r.copy_gbps, r.weight_bytes / 1048576.0, r.weight_bytes_read / 1048576.0, "kv",
      "format", "batch", "context", "prefill_s", "prefill_tok/s", "ms/step", "decode_tok/s",
      "MiB/step", "GB/s", "of_copy", "graphs", "async", "gemv", "start_s");
  for (const EngineBenchRow& w : r.rows) {
    absl::StrAppendFormat(
        &s,
        "%-8s %-22s %6d %7d %10.3f %12.0f %10.3f %11.0f %9.1f %8.1f %6.1f%% %6s %5s %4d %7.3f\n",
        w.kv_cache_dtype, w.kv_format, w.batch, w.context, w.prefill_s, w.prefill_tokens_per_s,
        w.decode_ms_per_step, w.decode_tokens_per_s, w.step_bytes / 1048576.0, w.gbps,
        100 * w.fraction_of_copy,
        // timed steps that replayed a graph
        w.cuda_graph_max_batch > 0 ? absl::StrCat(w.graph_steps) : "off",
        w.async_scheduling ? "on" : "off", w.decode_gemv_max_batch, w.start_s);
  }
  absl::StrAppendFormat(
      &s,
      "host us per decode step (Step's wall and CPU time, by phase)\n%-8s %6s %7s %6s %5s %8s %8s",
      "kv", "batch", "context", "graphs", "async", "wall", "cpu");
  for (int p = 0; p < static_cast<int>(worker::StepPhase::kCount); ++p) {
    absl::StrAppendFormat(&s, " %8s",
                          worker::StepPhaseName(static_cast<worker::StepPhase>(p)).substr(0, 8));
  }
  absl::StrAppendFormat(&s, " %8s %8s\n", "metrics", "events");
  for (const EngineBenchRow& w : r.rows) {
    absl::StrAppendFormat(
        &s, "%-8s %6d %7d %6s %5s %8.2f %8.2f", w.kv_cache_dtype, w.batch, w.context,
        w.cuda_graph_max_batch > 0 ? absl::StrCat(w.cuda_graph_max_batch) : "off",
        w.async_scheduling ? "on" : "off", w.host_us_per_step, w.host_cpu_us_per_step);
    for (double us : w.phase_us) absl::StrAppendFormat(&s, " %8.2f", us);
    absl::StrAppendFormat(&s, " %8.2f %8.2f\n", w.metrics_us_per_step, w.kv_events_per_step);
  }
  for (const EngineBenchRow& w : r.rows) {
    if (w.op_us.empty()) continue;
    absl::StrAppendFormat(
        &s, "device us per decode step by op: %s batch %d x %d, graphs %s, async %s, gemv %d\n",
        w.kv_cache_dtype, w.batch, w.context,
        w.cuda_graph_max_batch > 0 ? absl::StrCat(w.cuda_graph_max_batch) : "off",
        w.async_scheduling ? "on" : "off", w.decode_gemv_max_batch);
    double total = 0;
    for (const EngineBenchRow::OpUs& op : w.op_us) total += op.us_per_step;
    for (const EngineBenchRow::OpUs& op : w.op_us) {
      absl::StrAppendFormat(&s, "  %-14s %9.1f us %5.1f%% %7.1f calls\n", op.op, op.us_per_step,
                            total > 0 ? 100 * op.us_per_step / total : 0.0, op.calls_per_step);
    }
    absl::StrAppendFormat(&s, "  %-14s %9.1f us of %9.1f us per step\n", "ops", total,
                          1e3 * w.decode_ms_per_step);
  }
  return s;
}

}  // namespace kvserve::bench
