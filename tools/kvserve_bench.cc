// kvserve-bench: benchmarks. `quality` is the KV-quantization quality harness
// (tools/bench/kv_quality.h); `serve` is the serving load generator against a running router
// (tools/bench/serving.h), with vLLM's metrics and SGLang's shared-prefix dataset.
//
//   kvserve-bench quality --model DIR [--tokens 2048] [--json]
//   kvserve-bench serve --url http://127.0.0.1:8000 --dataset shared-prefix
//       --gsp-num-groups 16 --gsp-prompts-per-group 4 --gsp-system-prompt-len 512
//       --gsp-question-len 32 --gsp-output-len 16 [--request-rate inf]
//       [--max-concurrency 4] [--json] [--json-out FILE]
//
// `engine` is the offline engine benchmark (tools/bench/engine_bench.h): prefill and decode
// throughput in-process, per KV cache dtype, batch and context, against the memory roofline.
//
//   kvserve-bench engine --model DIR [--device cuda] [--kv-cache-dtypes auto,int8,int4]
//       [--batches 1,16,64] [--contexts 1024,4096] [--decode-steps 16] [--json-out FILE]
#include <fstream>
#include <iostream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/init.h"
#include "common/model/hf_config.h"
#include "nlohmann/json.hpp"
#include "tools/bench/engine_bench.h"
#include "tools/bench/kv_quality.h"
#include "tools/bench/serving.h"
#include "worker/model/step_profile.h"

ABSL_FLAG(std::string, model, "", "Model directory");
ABSL_FLAG(int32_t, tokens, 2048, "quality: teacher-forced stream length");
ABSL_FLAG(uint64_t, seed, 1, "quality: seed of the sampled stream; serve, engine: of the prompts");
ABSL_FLAG(int32_t, group_size, 32,
          "quality: channels per group for the per-group modes (capped at head_dim / 2)");
ABSL_FLAG(int32_t, decode_batch, 8, "quality: sequences in the decode timing");
ABSL_FLAG(int32_t, decode_context, 512, "quality: context per sequence in the decode timing");
ABSL_FLAG(int32_t, decode_steps, 32,
          "quality, engine: timed decode steps (quality: 0 skips the timing)");
ABSL_FLAG(bool, json, false,
          "quality: print JSON instead of the table; serve: print the JSON report after the table");

ABSL_FLAG(std::string, url, "http://127.0.0.1:8000",
          "serve: the router, or router replicas comma-separated (requests to each in turn)");
ABSL_FLAG(std::string, served_model, "", "serve: the model name to send (default: the router's)");
ABSL_FLAG(std::string, dataset, "random", "serve: random, shared-prefix, multi-turn or trace");
ABSL_FLAG(std::string, trace_file, "", "serve --dataset trace: a Mooncake JSONL trace");
ABSL_FLAG(int32_t, trace_block_size, 512, "serve --dataset trace: tokens per hash id");
ABSL_FLAG(double, trace_speedup, 1.0, "serve --dataset trace: trace time divided by this");
ABSL_FLAG(double, trace_window_start_s, 0, "serve --dataset trace: from this trace second...");
ABSL_FLAG(double, trace_window_end_s, 1e12, "serve --dataset trace: ...to this one");
ABSL_FLAG(double, trace_output_scale, 1.0, "serve --dataset trace: output lengths times this");
ABSL_FLAG(int32_t, trace_max_output, 0, "serve --dataset trace: cap on output lengths (0: none)");
ABSL_FLAG(int64_t, trace_spread_arrivals_ms, 0,
          "serve --dataset trace: spread each group of requests sharing a timestamp over the gap "
          "to the next, at most this many ms (the published traces bin them; 0: as recorded)");
ABSL_FLAG(int32_t, num_prompts, 64, "serve: requests of the random dataset");
ABSL_FLAG(std::string, request_rate, "inf", "serve: requests per second (Poisson) or inf");
ABSL_FLAG(int32_t, max_concurrency, 0, "serve: requests in flight at most (0: no cap)");
ABSL_FLAG(int32_t, vocab_size, 32000, "serve: prompt token ids are drawn below this");
ABSL_FLAG(int32_t, block_size, 16,
          "serve: the workers' block size (for the ideal hit rate); engine: the KV block size");
ABSL_FLAG(int32_t, random_input_len, 256, "serve: random dataset prompt tokens");
ABSL_FLAG(int32_t, random_output_len, 32, "serve: random dataset output tokens");
ABSL_FLAG(bool, keep_alive, true,
          "serve: reuse kept-alive connections between requests, as SDKs and load balancers do "
          "(false: a new connection per request)");
ABSL_FLAG(bool, text_prompts, false,
          "serve: send prompts as text (a common English word per token id) for the router to "
          "tokenize, instead of token ids");
ABSL_FLAG(int32_t, gsp_num_groups, 16, "serve: shared-prefix groups");
ABSL_FLAG(int32_t, gsp_prompts_per_group, 4, "serve: shared-prefix prompts per group");
ABSL_FLAG(int32_t, gsp_system_prompt_len, 512, "serve: shared-prefix system prompt tokens");
ABSL_FLAG(int32_t, gsp_question_len, 32, "serve: shared-prefix question tokens");
ABSL_FLAG(int32_t, gsp_output_len, 16, "serve: shared-prefix output tokens");
ABSL_FLAG(int32_t, multi_turn_conversations, 8, "serve: multi-turn conversations");
ABSL_FLAG(int32_t, multi_turn_turns, 4, "serve: turns per conversation");
ABSL_FLAG(int32_t, multi_turn_input_len, 64, "serve: new prompt tokens per turn");
ABSL_FLAG(int32_t, multi_turn_output_len, 16, "serve: output tokens per turn");
ABSL_FLAG(std::string, goodput, "",
          "serve: SLOs for goodput, e.g. \"ttft:500 tpot:50 e2el:2000\" (milliseconds)");
ABSL_FLAG(std::string, json_out, "", "serve, engine: also write the report as JSON to this file");

ABSL_FLAG(std::string, device, "cpu", "engine: cpu, cuda, or null (no model: the host path alone)");
ABSL_FLAG(std::string, dtype, "auto", "engine: weights (auto, float32, bfloat16, float16)");
ABSL_FLAG(std::string, attention_kernel, "simt",
          "engine: CUDA attention (simt, tensor-cores, pipelined)");
ABSL_FLAG(std::string, cuda_graph_max_batch, "0",
          "engine: comma-separated --cuda-graph-max-batch values, one engine each (0: no CUDA "
          "graphs; e.g. 0,16 times decode without and with them)");
ABSL_FLAG(std::string, decode_gemv_max_batch, "0",
          "engine: comma-separated --decode-gemv-max-batch values, one engine each (0: cuBLAS; "
          "e.g. 0,8 times decode without and with the fused projections)");
ABSL_FLAG(int32_t, cpu_threads, 1, "engine: threads of the CPU backend's GEMMs");
ABSL_FLAG(std::string, async, "auto",
          "engine: comma-separated async scheduling modes, one engine each: auto (on for CUDA "
          "with one rank), on, off");
ABSL_FLAG(bool, op_times, false,
          "engine: time each op of the timed decode steps on the device (CUDA events; adds "
          "their cost to ms/step)");
ABSL_FLAG(bool, prefix_caching, true,
          "engine: hash and cache full blocks as a worker does (their KV events counted)");
ABSL_FLAG(std::string, kv_cache_dtypes, "auto",
          "engine: comma-separated --kv-cache-dtype values, one engine each (per-token scales)");
ABSL_FLAG(std::string, batches, "1,16", "engine: comma-separated batch sizes");
ABSL_FLAG(std::string, contexts, "512", "engine: comma-separated prompt lengths");
ABSL_FLAG(int32_t, warmup_steps, 2, "engine: decode steps before the timed ones");
ABSL_FLAG(int32_t, max_num_batched_tokens, 8192, "engine: prefill tokens per step");

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

// "1,16,64" as numbers; InvalidArgument naming `flag` otherwise.
absl::StatusOr<std::vector<int>> ParseIntList(const std::string& flag, const std::string& text) {
  std::vector<int> out;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    int v = 0;
    if (!absl::SimpleAtoi(item, &v)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, " '", text, "' is not a comma-separated list of integers"));
    }
    out.push_back(v);
  }
  return out;
}

// A row's µs per step of each phase, by the phase's name.
nlohmann::json PhaseJson(const std::vector<double>& phase_us) {
  nlohmann::json j = nlohmann::json::object();
  for (size_t p = 0; p < phase_us.size(); ++p) {
    j[std::string(worker::StepPhaseName(static_cast<worker::StepPhase>(p)))] = phase_us[p];
  }
  return j;
}

// A row's device time per op: µs and calls per step, by op.
nlohmann::json OpJson(const std::vector<bench::EngineBenchRow::OpUs>& ops) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& op : ops) j[op.op] = {{"us", op.us_per_step}, {"calls", op.calls_per_step}};
  return j;
}

nlohmann::json EngineBenchJson(const bench::EngineBenchReport& r) {
  nlohmann::json rows = nlohmann::json::array();
  for (const bench::EngineBenchRow& w : r.rows) {
    rows.push_back({{"kv_cache_dtype", w.kv_cache_dtype},
                    {"kv_format", w.kv_format},
                    {"batch", w.batch},
                    {"context", w.context},
                    {"prefill_s", w.prefill_s},
                    {"prefill_tokens_per_s", w.prefill_tokens_per_s},
                    {"decode_ms_per_step", w.decode_ms_per_step},
                    {"decode_tokens_per_s", w.decode_tokens_per_s},
                    {"step_bytes", w.step_bytes},
                    {"step_kv_bytes", w.step_kv_bytes},
                    {"gbps", w.gbps},
                    {"fraction_of_copy", w.fraction_of_copy},
                    {"cuda_graph_max_batch", w.cuda_graph_max_batch},
                    {"decode_gemv_max_batch", w.decode_gemv_max_batch},
                    {"async_scheduling", w.async_scheduling},
                    {"graph_steps", w.graph_steps},
                    {"start_s", w.start_s},
                    {"graph_record_s", w.graph_record_s},
                    {"graph_record_mib", w.graph_record_mib},
                    {"host_us_per_step", w.host_us_per_step},
                    {"host_cpu_us_per_step", w.host_cpu_us_per_step},
                    {"phase_us", PhaseJson(w.phase_us)},
                    {"metrics_us_per_step", w.metrics_us_per_step},
                    {"kv_events_per_step", w.kv_events_per_step},
                    {"op_us", OpJson(w.op_us)}});
  }
  return {{"device", r.device},
          {"copy_gbps", r.copy_gbps},
          {"weight_bytes", r.weight_bytes},
          {"weight_bytes_read", r.weight_bytes_read},
          {"rows", rows}};
}

int EngineBench() {
  bench::EngineBenchOptions o;
  o.model_dir = absl::GetFlag(FLAGS_model);
  o.device = absl::GetFlag(FLAGS_device);
  o.dtype = absl::GetFlag(FLAGS_dtype);
  o.attention_kernel = absl::GetFlag(FLAGS_attention_kernel);
  o.cpu_threads = absl::GetFlag(FLAGS_cpu_threads);
  o.prefix_caching = absl::GetFlag(FLAGS_prefix_caching);
  o.op_times = absl::GetFlag(FLAGS_op_times);
  o.async_scheduling = absl::StrSplit(absl::GetFlag(FLAGS_async), ',', absl::SkipEmpty());
  o.block_size = absl::GetFlag(FLAGS_block_size);
  o.kv_cache_dtypes = absl::StrSplit(absl::GetFlag(FLAGS_kv_cache_dtypes), ',', absl::SkipEmpty());
  o.warmup_steps = absl::GetFlag(FLAGS_warmup_steps);
  o.decode_steps = absl::GetFlag(FLAGS_decode_steps);
  o.max_num_batched_tokens = absl::GetFlag(FLAGS_max_num_batched_tokens);
  o.seed = absl::GetFlag(FLAGS_seed);
  absl::StatusOr<std::vector<int>> batches = ParseIntList("batches", absl::GetFlag(FLAGS_batches));
  absl::StatusOr<std::vector<int>> contexts =
      ParseIntList("contexts", absl::GetFlag(FLAGS_contexts));
  absl::StatusOr<std::vector<int>> graphs =
      ParseIntList("cuda-graph-max-batch", absl::GetFlag(FLAGS_cuda_graph_max_batch));
  absl::StatusOr<std::vector<int>> gemv =
      ParseIntList("decode-gemv-max-batch", absl::GetFlag(FLAGS_decode_gemv_max_batch));
  for (const absl::Status& s :
       {batches.status(), contexts.status(), graphs.status(), gemv.status()}) {
    if (!s.ok()) {
      std::cerr << "kvserve-bench engine: " << s.message() << "\n";
      return 2;
    }
  }
  o.batches = *batches;
  o.contexts = *contexts;
  o.cuda_graph_max_batches = *graphs;
  o.decode_gemv_max_batches = *gemv;
  o.on_row = [](const bench::EngineBenchRow& w) {
    std::cerr << "kvserve-bench engine: " << w.kv_cache_dtype << " " << w.batch << " x "
              << w.context << ": prefill " << w.prefill_tokens_per_s << " tokens/s, decode "
              << w.decode_ms_per_step << " ms/step, " << 100 * w.fraction_of_copy
              << "% of copy bandwidth\n";
  };
  absl::StatusOr<bench::EngineBenchReport> report = bench::RunEngineBench(o);
  if (!report.ok()) {
    std::cerr << "kvserve-bench engine: " << report.status().message() << "\n";
    return report.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  std::cout << bench::FormatEngineBench(*report);
  if (const std::string path = absl::GetFlag(FLAGS_json_out); !path.empty()) {
    std::ofstream f(path);
    f << EngineBenchJson(*report).dump(2) << "\n";
    if (!f) {
      std::cerr << "kvserve-bench engine: cannot write " << path << "\n";
      return 1;
    }
  }
  return 0;
}

absl::Status ParseGoodput(const std::string& spec, bench::ServingOptions* o) {
  for (absl::string_view item : absl::StrSplit(spec, ' ', absl::SkipEmpty())) {
    std::pair<std::string, std::string> kv = absl::StrSplit(item, absl::MaxSplits(':', 1));
    double ms = 0;
    if (!absl::SimpleAtod(kv.second, &ms) || ms <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--goodput '", item, "' is not NAME:MILLISECONDS (> 0)"));
    }
    if (kv.first == "ttft") {
      o->slo_ttft_ms = ms;
    } else if (kv.first == "tpot") {
      o->slo_tpot_ms = ms;
    } else if (kv.first == "e2el") {
      o->slo_e2e_ms = ms;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("--goodput names '", kv.first, "'; use ttft, tpot or e2el"));
    }
  }
  return absl::OkStatus();
}

int Serve() {
  bench::ServingOptions o;
  o.url = absl::GetFlag(FLAGS_url);
  o.model = absl::GetFlag(FLAGS_served_model);
  o.dataset = absl::GetFlag(FLAGS_dataset);
  o.trace_file = absl::GetFlag(FLAGS_trace_file);
  o.trace_block_size = absl::GetFlag(FLAGS_trace_block_size);
  o.trace_speedup = absl::GetFlag(FLAGS_trace_speedup);
  o.trace_window_start_s = absl::GetFlag(FLAGS_trace_window_start_s);
  o.trace_window_end_s = absl::GetFlag(FLAGS_trace_window_end_s);
  o.trace_output_scale = absl::GetFlag(FLAGS_trace_output_scale);
  o.trace_max_output = absl::GetFlag(FLAGS_trace_max_output);
  o.trace_spread_arrivals_ms = absl::GetFlag(FLAGS_trace_spread_arrivals_ms);
  o.num_prompts = absl::GetFlag(FLAGS_num_prompts);
  const std::string rate = absl::GetFlag(FLAGS_request_rate);
  if (rate != "inf" && !absl::SimpleAtod(rate, &o.request_rate)) {
    std::cerr << "kvserve-bench serve: --request-rate '" << rate << "' is not a number or inf\n";
    return 2;
  }
  o.max_concurrency = absl::GetFlag(FLAGS_max_concurrency);
  o.seed = absl::GetFlag(FLAGS_seed);
  o.vocab_size = absl::GetFlag(FLAGS_vocab_size);
  o.block_size = absl::GetFlag(FLAGS_block_size);
  o.random_input_len = absl::GetFlag(FLAGS_random_input_len);
  o.random_output_len = absl::GetFlag(FLAGS_random_output_len);
  o.text_prompts = absl::GetFlag(FLAGS_text_prompts);
  o.keep_alive = absl::GetFlag(FLAGS_keep_alive);
  o.gsp_num_groups = absl::GetFlag(FLAGS_gsp_num_groups);
  o.gsp_prompts_per_group = absl::GetFlag(FLAGS_gsp_prompts_per_group);
  o.gsp_system_prompt_len = absl::GetFlag(FLAGS_gsp_system_prompt_len);
  o.gsp_question_len = absl::GetFlag(FLAGS_gsp_question_len);
  o.gsp_output_len = absl::GetFlag(FLAGS_gsp_output_len);
  o.multi_turn_conversations = absl::GetFlag(FLAGS_multi_turn_conversations);
  o.multi_turn_turns = absl::GetFlag(FLAGS_multi_turn_turns);
  o.multi_turn_input_len = absl::GetFlag(FLAGS_multi_turn_input_len);
  o.multi_turn_output_len = absl::GetFlag(FLAGS_multi_turn_output_len);
  if (absl::Status s = ParseGoodput(absl::GetFlag(FLAGS_goodput), &o); !s.ok()) {
    std::cerr << "kvserve-bench serve: " << s.message() << "\n";
    return 2;
  }
  absl::StatusOr<nlohmann::json> report = bench::RunServing(o);
  if (!report.ok()) {
    std::cerr << "kvserve-bench serve: " << report.status().message() << "\n";
    return report.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  std::cout << bench::FormatServingReport(*report);
  if (absl::GetFlag(FLAGS_json)) std::cout << report->dump(2) << "\n";
  if (const std::string path = absl::GetFlag(FLAGS_json_out); !path.empty()) {
    std::ofstream f(path);
    f << report->dump(2) << "\n";
    if (!f) {
      std::cerr << "kvserve-bench serve: cannot write " << path << "\n";
      return 1;
    }
  }
  return (*report)["failed"].get<int>() == 0 ? 0 : 1;
}

}  // namespace
}  // namespace kvserve

int main(int argc, char** argv) {
  std::vector<char*> args = kvserve::InitProgram(
      argc, argv,
      "kvserve-bench quality --model DIR [--tokens N] [--json]: KV quantization quality\n"
      "kvserve-bench serve --url URL [--dataset random|shared-prefix|multi-turn] ...: serving "
      "load against a router\n"
      "kvserve-bench engine --model DIR [--device cuda] [--kv-cache-dtypes auto,int8] "
      "[--batches 1,16] [--contexts 512]: engine prefill and decode throughput");
  const std::string command = args.size() >= 2 ? args[1] : "";
  if (command == "quality") return kvserve::Quality();
  if (command == "serve") return kvserve::Serve();
  if (command == "engine") return kvserve::EngineBench();
  std::cerr << "kvserve-bench: give a command: quality, serve or engine\n";
  return 2;
}
