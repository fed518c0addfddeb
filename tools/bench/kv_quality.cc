#include "tools/bench/kv_quality.h"

#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "worker/engine.h"

namespace kvserve::bench {
namespace {

using worker::Engine;
using worker::EngineConfig;
using worker::RequestInput;

EngineConfig BaseConfig(const QualityOptions& o, const KvQuantOptions& quant, int max_len) {
  EngineConfig c;
  c.model_dir = o.model_dir;
  c.cache.block_size = o.block_size;
  c.max_model_len = max_len;
  c.cache.kv_quant = quant;
  c.cache.enable_prefix_caching = false;
  c.cache.num_blocks = (max_len / o.block_size + 2) * std::max(1, o.decode_batch);
  c.scheduler.max_num_seqs = std::max(1, o.decode_batch);
  c.scheduler.max_num_batched_tokens = 1024;
  return c;
}

absl::StatusOr<std::vector<worker::SequenceOutput>> Drain(Engine& engine) {
  std::vector<worker::SequenceOutput> all;
  while (engine.HasWork()) {
    ASSIGN_OR_RETURN(std::vector<worker::SequenceOutput> outs, engine.Step());
    for (auto& o : outs) all.push_back(std::move(o));
  }
  return all;
}

// log-softmax of one row.
void LogSoftmax(const float* x, int n, std::vector<double>* out) {
  out->resize(n);
  const float m = *std::max_element(x, x + n);
  double z = 0;
  for (int i = 0; i < n; ++i) z += std::exp(static_cast<double>(x[i]) - m);
  const double lz = m + std::log(z);
  for (int i = 0; i < n; ++i) (*out)[i] = x[i] - lz;
}

absl::StatusOr<std::vector<float>> StreamLogits(const QualityOptions& o, const KvQuantOptions& q,
                                                const std::vector<int32_t>& stream, int max_len) {
  ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(BaseConfig(o, q, max_len)));
  RequestInput in;
  in.request_id = "stream";
  in.prompt = stream;
  in.max_tokens = 1;
  in.return_prompt_logits = true;
  RETURN_IF_ERROR(engine->AddRequest(in));
  ASSIGN_OR_RETURN(auto outs, Drain(*engine));
  for (auto& out : outs) {
    if (out.request_finished) return std::move(out.prompt_logits);
  }
  return absl::InternalError("the stream request did not finish");
}

absl::StatusOr<double> DecodeMicrosPerToken(const QualityOptions& o, const KvQuantOptions& q,
                                            int vocab) {
  const int max_len = o.decode_context + o.decode_steps + 8;
  ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(BaseConfig(o, q, max_len)));
  for (int i = 0; i < o.decode_batch; ++i) {
    RequestInput in;
    in.request_id = absl::StrCat(i);
    for (int t = 0; t < o.decode_context; ++t) in.prompt.push_back((t * 31 + i * 7) % vocab);
    in.max_tokens = o.decode_steps + 4;
    in.sampling.ignore_eos = true;
    RETURN_IF_ERROR(engine->AddRequest(in));
  }
  // Prefill until every sequence decodes.
  while (engine->stats().computed_prompt_tokens < int64_t{o.decode_batch} * o.decode_context) {
    RETURN_IF_ERROR(engine->Step().status());
  }
  const auto start = std::chrono::steady_clock::now();
  for (int s = 0; s < o.decode_steps; ++s) RETURN_IF_ERROR(engine->Step().status());
  const double us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  return us / (o.decode_steps * o.decode_batch);
}

}  // namespace

std::vector<KvMode> DefaultKvModes(int g) {
  auto m = [](std::string name, std::string dtype, std::string gran, int group,
              std::string fp = "") {
    return KvMode{std::move(name),
                  KvQuantOptions{std::move(dtype), std::move(gran), group, std::move(fp)}};
  };
  return {
      m("FP32 (reference)", "auto", "per_token", g),
      m("FP16", "fp16", "per_token", g),
      m("BF16", "bf16", "per_token", g),
      m("FP8 E4M3 per-token", "fp8_e4m3", "per_token", g),
      m("INT8 per-token", "int8", "per_token", g),
      m("INT8 per-group", "int8", "per_group", g),
      m("INT8 per-channel K", "int8", "k:per_channel,v:per_token", g),
      m("INT4 per-token (ungrouped)", "int4", "per_token", g),
      m("INT4 per-group", "int4", "per_group", g),
      m("INT4 per-channel K, per-token V", "int4", "k:per_channel,v:per_token", g),
      m("INT4 per-group, first+last layer FP32", "int4", "per_group", g, "first:1,last:1"),
  };
}

absl::StatusOr<std::vector<ModeQuality>> MeasureKvQuality(const QualityOptions& o,
                                                          const std::vector<KvMode>& modes) {
  if (o.num_tokens < 2) return absl::InvalidArgumentError("--tokens must be at least 2");
  const int max_len = o.num_tokens + 8;
  // The stream: sampled from the model with the reference (fp32) cache.
  ASSIGN_OR_RETURN(std::unique_ptr<Engine> sampler, Engine::Create(BaseConfig(o, {}, max_len)));
  const int vocab = sampler->model_config().vocab_size;
  RequestInput gen;
  gen.request_id = "gen";
  for (int i = 0; i < 8; ++i)
    gen.prompt.push_back(static_cast<int32_t>((o.seed * 977 + i * 131) % vocab));
  gen.max_tokens = o.num_tokens - static_cast<int>(gen.prompt.size());
  gen.sampling.temperature = 1.0f;
  gen.sampling.seed = o.seed;
  gen.sampling.ignore_eos = true;
  RETURN_IF_ERROR(sampler->AddRequest(gen));
  std::vector<int32_t> stream = gen.prompt;
  ASSIGN_OR_RETURN(auto outs, Drain(*sampler));
  for (const auto& out : outs)
    stream.insert(stream.end(), out.new_tokens.begin(), out.new_tokens.end());
  sampler.reset();

  ASSIGN_OR_RETURN(std::vector<float> ref, StreamLogits(o, {}, stream, max_len));
  ASSIGN_OR_RETURN(ModelConfig mc, LoadHfConfig(o.model_dir));
  ASSIGN_OR_RETURN(KvCacheSpec fp16_spec,
                   MakeKvCacheSpec({.dtype = "fp16"}, mc.num_layers, mc.head_dim));
  const double fp16_bytes = fp16_spec.BytesPerToken(mc.num_kv_heads, o.block_size, mc.head_dim);
  const int n = static_cast<int>(stream.size());
  std::vector<double> lp_ref, lp;
  double ref_nll = 0;
  for (int i = 0; i + 1 < n; ++i) {
    LogSoftmax(ref.data() + int64_t{i} * vocab, vocab, &lp_ref);
    ref_nll -= lp_ref[stream[i + 1]];
  }
  const double ref_ppl = std::exp(ref_nll / (n - 1));

  std::vector<ModeQuality> rows;
  for (const KvMode& mode : modes) {
    ModeQuality q;
    q.name = mode.name;
    ASSIGN_OR_RETURN(KvCacheSpec spec, MakeKvCacheSpec(mode.quant, mc.num_layers, mc.head_dim));
    q.format = spec.CacheKeyQuant();
    q.kv_bytes_per_token = spec.BytesPerToken(mc.num_kv_heads, o.block_size, mc.head_dim);
    q.memory_vs_fp16 = q.kv_bytes_per_token / fp16_bytes;
    ASSIGN_OR_RETURN(std::vector<float> got, StreamLogits(o, mode.quant, stream, max_len));
    double kl = 0, nll = 0;
    int agree = 0;
    for (int i = 0; i < n; ++i) {
      const float* a = ref.data() + int64_t{i} * vocab;
      const float* b = got.data() + int64_t{i} * vocab;
      agree += (std::max_element(a, a + vocab) - a) == (std::max_element(b, b + vocab) - b);
      LogSoftmax(a, vocab, &lp_ref);
      LogSoftmax(b, vocab, &lp);
      for (int v = 0; v < vocab; ++v) kl += std::exp(lp_ref[v]) * (lp_ref[v] - lp[v]);
      if (i + 1 < n) nll -= lp[stream[i + 1]];
    }
    q.top1_agreement = static_cast<double>(agree) / n;
    q.mean_kl = kl / n;
    q.perplexity = std::exp(nll / (n - 1));
    q.perplexity_ratio = q.perplexity / ref_ppl;
    if (o.decode_steps > 0) {
      ASSIGN_OR_RETURN(q.decode_us_per_token, DecodeMicrosPerToken(o, mode.quant, vocab));
    }
    rows.push_back(q);
  }
  return rows;
}

std::string FormatQualityTable(const std::vector<ModeQuality>& rows) {
  std::string out =
      absl::StrFormat("| %-40s | %10s | %8s | %9s | %10s | %9s | %12s |\n", "KV mode", "B/token",
                      "vs FP16", "top-1", "mean KL", "ppl ratio", "decode us/tok");
  out += "|" + std::string(42, '-') + "|" + std::string(12, '-') + "|" + std::string(10, '-') +
         "|" + std::string(11, '-') + "|" + std::string(12, '-') + "|" + std::string(11, '-') +
         "|" + std::string(14, '-') + "|\n";
  for (const ModeQuality& q : rows) {
    out += absl::StrFormat("| %-40s | %10.2f | %7.3fx | %8.2f%% | %10.2e | %9.4f | %12.1f |\n",
                           q.name, q.kv_bytes_per_token, q.memory_vs_fp16, 100 * q.top1_agreement,
                           q.mean_kl, q.perplexity_ratio, q.decode_us_per_token);
  }
  return out;
}

}  // namespace kvserve::bench
