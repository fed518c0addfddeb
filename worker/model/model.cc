#include "worker/model/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/model/model_weights.h"
#include "common/model/safetensors.h"
#include "common/status_macros.h"
#include "common/string_util.h"
#include "glog/logging.h"
#include "kernels/cpu/sampling.h"
#include "kernels/rope.h"
#include "worker/model/decode_graphs.h"
#include "worker/model/weight_reader.h"

namespace kvserve::worker {
namespace {

// A logprobs request's results, in 32-bit words: its logprob, its rank, the top ids and values.
constexpr int64_t kLogprobWords = 2 + 2 * kernels::kMaxTopLogprobs;

// Appends `v`'s bytes to `out`, padded to 8 bytes; returns where they start.
template <typename V>
size_t Pack(const V& v, std::vector<uint8_t>& out) {
  const size_t at = out.size();
  const size_t bytes = v.size() * sizeof(v[0]);
  out.resize(at + (bytes + 7) / 8 * 8);
  if (bytes > 0) std::memcpy(out.data() + at, v.data(), bytes);
  return at;
}

}  // namespace

int Model::LocalKvHeads(const ModelConfig& c, int size) {
  return c.num_kv_heads >= size ? c.num_kv_heads / size : 1;
}

absl::Status Model::CheckShardable(const ModelConfig& c, int size) {
  if (size < 1) return absl::InvalidArgumentError("--tensor-parallel-size must be >= 1");
  if (c.num_heads % size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--tensor-parallel-size ", size,
                                                   " does not divide the attention heads (",
                                                   c.num_heads, ")"));
  }
  if (c.num_kv_heads % size != 0 && size % c.num_kv_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tensor-parallel-size ", size,
                     " neither divides nor is a multiple of the KV heads (", c.num_kv_heads, ")"));
  }
  if (c.intermediate_size % size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--tensor-parallel-size ", size,
                                                   " does not divide intermediate_size (",
                                                   c.intermediate_size, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Model>> Model::Load(const std::string& dir,
                                                   const ModelConfig& config,
                                                   kernels::Backend* backend,
                                                   const ModelLoadOptions& options) {
  const TpShard shard = options.shard;
  RETURN_IF_ERROR(CheckShardable(config, shard.size));
  if (shard.size > 1 && options.comm == nullptr) {
    return absl::InvalidArgumentError("a tensor-parallel shard needs a communicator");
  }
  const DType wt = options.weight_type;
  if (wt != DType::kF32 && wt != DType::kBF16 && wt != DType::kF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("weights cannot be stored as ", Sv(DTypeName(wt)), " (F32, BF16 or F16)"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt, Checkpoint::Open(dir));
  RETURN_IF_ERROR(CheckWeights(config, *ckpt));
  std::unique_ptr<Model> m(new Model(config, backend, options));
  const int r = shard.rank, n = shard.size;
  m->heads_ = config.num_heads / n;
  m->kv_heads_ = LocalKvHeads(config, n);
  m->inter_ = config.intermediate_size / n;
  // KV heads of this rank: a slice, or the one head its query heads read when replicated.
  const int kv0 = config.num_kv_heads >= n ? r * m->kv_heads_ : r * config.num_kv_heads / n;
  const int q0 = r * m->heads_, i0 = r * m->inter_;
  m->vocab_shard_ = (config.vocab_size + n - 1) / n;
  const int v0 = std::min(config.vocab_size, r * m->vocab_shard_);
  const int v1 = std::min(config.vocab_size, v0 + m->vocab_shard_);

  // Into the backend's memory, one tensor group at a time (host memory holds at most a layer):
  // vectors as float32, matrices in the weight type.
  const WeightReader read(*ckpt, wt);
  std::vector<uint8_t> embed, lm_head;
  std::vector<float> final_norm;
  RETURN_IF_ERROR(read.Matrix("model.embed_tokens.weight", &embed));
  RETURN_IF_ERROR(read.Vector("model.norm.weight", &final_norm));
  m->embed_ = m->UploadMatrix(embed);
  m->final_norm_ = m->Upload(final_norm);
  if (!config.tie_word_embeddings || n > 1) {  // tied and unsharded: the embedding serves
    const std::string head =
        config.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
    RETURN_IF_ERROR(read.MatrixRows(head, v0, v1, &lm_head));
    lm_head.resize(static_cast<size_t>(m->vocab_shard_) * config.hidden_size * DTypeSize(wt),
                   0);  // pad the last rank's slice
    m->lm_head_ = m->UploadMatrix(lm_head);
  }
  m->layers_.resize(config.num_layers);
  for (int l = 0; l < config.num_layers; ++l) {
    RETURN_IF_ERROR(m->LoadLayer(read, l, {.q0 = q0, .kv0 = kv0, .i0 = i0}));
  }
  m->inv_freq_ =
      kernels::Buffer<float>::FromHost(backend, kernels::RopeInvFreq(config.rope, config.head_dim));
  return m;
}

kernels::Buffer<float> Model::Upload(const std::vector<float>& v) {
  weight_bytes_ += static_cast<int64_t>(v.size() * sizeof(float));
  return kernels::Buffer<float>::FromHost(backend_, v);
}

Model::Matrix Model::UploadMatrix(const std::vector<uint8_t>& bytes) {
  weight_bytes_ += static_cast<int64_t>(bytes.size());
  return Matrix::FromHost(backend_, bytes);
}

absl::Status Model::LoadLayer(const WeightReader& read, int l, const ShardOrigin& at) {
  const ModelConfig& config = config_;
  const int d = config.head_dim, i0 = at.i0, i1 = at.i0 + inter_;
  const bool rank0 = shard_.rank == 0;
  const std::string p = absl::StrCat("model.layers.", l, ".");
  std::vector<float> input_norm, post_norm, qkv_bias, q_norm, k_norm, o_bias, gate_up_bias,
      down_bias;
  std::vector<uint8_t> qkv, o, gate_up, down;
  RETURN_IF_ERROR(read.Vector(p + "input_layernorm.weight", &input_norm));
  RETURN_IF_ERROR(read.Vector(p + "post_attention_layernorm.weight", &post_norm));
  const struct {
    const char* proj;
    int first, count;
  } parts[] = {
      {"q_proj", at.q0, heads_}, {"k_proj", at.kv0, kv_heads_}, {"v_proj", at.kv0, kv_heads_}};
  for (const auto& part : parts) {
    const std::string name = absl::StrCat(p, "self_attn.", part.proj);
    const int64_t r0 = int64_t{part.first} * d, r1 = int64_t{part.first + part.count} * d;
    RETURN_IF_ERROR(read.MatrixRows(name + ".weight", r0, r1, &qkv));
    if (config.qkv_bias) RETURN_IF_ERROR(read.VectorRows(name + ".bias", r0, r1, &qkv_bias));
  }
  if (config.qk_norm) {
    RETURN_IF_ERROR(read.Vector(p + "self_attn.q_norm.weight", &q_norm));
    RETURN_IF_ERROR(read.Vector(p + "self_attn.k_norm.weight", &k_norm));
  }
  RETURN_IF_ERROR(read.MatrixColumns(p + "self_attn.o_proj.weight", int64_t{at.q0} * d,
                                     int64_t{at.q0 + heads_} * d, &o));
  // Row-parallel biases are added once, by rank 0, before the all-reduce.
  if (config.o_bias && rank0) RETURN_IF_ERROR(read.Vector(p + "self_attn.o_proj.bias", &o_bias));
  RETURN_IF_ERROR(read.MatrixRows(p + "mlp.gate_proj.weight", i0, i1, &gate_up));
  RETURN_IF_ERROR(read.MatrixRows(p + "mlp.up_proj.weight", i0, i1, &gate_up));
  RETURN_IF_ERROR(read.MatrixColumns(p + "mlp.down_proj.weight", i0, i1, &down));
  if (config.mlp_bias) {
    RETURN_IF_ERROR(read.VectorRows(p + "mlp.gate_proj.bias", i0, i1, &gate_up_bias));
    RETURN_IF_ERROR(read.VectorRows(p + "mlp.up_proj.bias", i0, i1, &gate_up_bias));
    if (rank0) RETURN_IF_ERROR(read.Vector(p + "mlp.down_proj.bias", &down_bias));
  }
  Layer& L = layers_[l];
  L.input_norm = Upload(input_norm);
  L.post_norm = Upload(post_norm);
  L.qkv = UploadMatrix(qkv);
  L.qkv_bias = Upload(qkv_bias);
  L.q_norm = Upload(q_norm);
  L.k_norm = Upload(k_norm);
  L.o = UploadMatrix(o);
  L.o_bias = Upload(o_bias);
  L.gate_up = UploadMatrix(gate_up);
  L.gate_up_bias = Upload(gate_up_bias);
  L.down = UploadMatrix(down);
  L.down_bias = Upload(down_bias);
  return absl::OkStatus();
}

Model::Model(const ModelConfig& config, kernels::Backend* backend, const ModelLoadOptions& options)
    : config_(config),
      backend_(backend),
      shard_(options.shard),
      comm_(options.comm),
      weight_type_(options.weight_type),
      graph_max_batch_(options.graph_max_batch),
      graph_max_blocks_per_seq_(options.graph_max_blocks_per_seq) {}

Model::~Model() = default;

template <typename T>
T* Model::Reserve(kernels::Buffer<T>& buf, size_t n, bool graphs_use) {
  if (const size_t had = buf.size(); had < n) {
    if (graphs_use && graphs_ != nullptr && graphs_->size() > 0) {  // they read the old buffer
      graphs_->Keep(std::make_shared<kernels::Buffer<T>>(std::move(buf)));
    }
    buf = kernels::Buffer<T>(backend_, std::max(n, 2 * had));
  }
  return buf.data();
}

Model::Activations Model::ReserveActivations(int64_t tokens) {
  const ModelConfig& c = config_;
  const int64_t H = c.hidden_size, q_dim = int64_t{heads_} * c.head_dim;
  const int64_t qkv_dim = q_dim + 2 * int64_t{kv_heads_} * c.head_dim;
  Scratch& s = scratch_;
  const bool x16 = weight_type_ != DType::kF32;
  return {Reserve(s.delta, tokens * H, true),
          Reserve(s.residual, tokens * H, true),
          Reserve(s.h, tokens * H, true),
          Reserve(s.qkv, tokens * qkv_dim, true),
          x16 ? nullptr : Reserve(s.attn, tokens * q_dim, true),
          Reserve(s.gate_up, tokens * 2 * inter_, true),
          x16 ? nullptr : Reserve(s.act, tokens * inter_, true),
          x16 ? Reserve(s.h16, tokens * H, true) : nullptr,
          x16 ? Reserve(s.attn16, tokens * q_dim, true) : nullptr,
          x16 ? Reserve(s.act16, tokens * inter_, true) : nullptr,
          x16 ? Reserve(s.residual_alt, std::min(tokens, backend_->DecodeGemvRows(H)) * H, true)
              : nullptr};
}

Model::LogitBuffers Model::ReserveLogits(int64_t rows) {
  const int64_t vs = vocab_shard_;
  Scratch& s = scratch_;
  return {Reserve(s.selected, rows * config_.hidden_size, true), Reserve(s.local, rows * vs, true),
          comm_ != nullptr ? Reserve(s.gathered, rows * vs * shard_.size, true) : nullptr};
}

void Model::ReserveScratch(int64_t tokens, int64_t logit_rows, int64_t samples, int64_t context) {
  const int64_t seqs = std::min(tokens, logit_rows);  // a logits row each at least
  // The backend's own first (attention's split-KV workspace; the LM head's rows rounded to the
  // weights' 16 bits), then the model's.
  backend_->ReserveScratch({.tokens = tokens,
                            .seqs = seqs,
                            .context = context,
                            .num_heads = heads_,
                            .num_kv_heads = kv_heads_,
                            .head_dim = config_.head_dim,
                            .rounded_gemm_rows = weight_type_ != DType::kF32 ? logit_rows : 0,
                            .rounded_gemm_k = config_.hidden_size});
  ReserveActivations(tokens);
  ReserveLogits(logit_rows);
  // Logprobs: one per draw, and one per prompt row (prompt_logprobs).
  const int64_t result_words = samples + (samples + logit_rows) * kLogprobWords;
  Reserve(scratch_.results, result_words);
  // Async scheduling's: the results in pinned memory, and the pending rows' lists.
  for (kernels::Buffer<uint32_t>& pinned : scratch_.results_pinned) {
    if (pinned.size() < static_cast<size_t>(result_words)) {
      pinned = kernels::Buffer<uint32_t>(backend_, result_words, /*host=*/true);
    }
  }
  Reserve(scratch_.pending, 2 * seqs);
  Reserve(scratch_.host_rows, HostRowsPerCopy() * config_.vocab_size);
  // The packed batch (Forward) at its largest: each part padded to 8 bytes, a sequence per
  // logits row at most, the block tables at their widest, a logprobs request per sample and
  // per logits row.
  auto part = [](int64_t n, size_t bytes) { return (static_cast<size_t>(n) * bytes + 7) / 8 * 8; };
  Reserve(scratch_.batch, 2 * part(tokens, sizeof(int32_t)) + part(tokens, sizeof(int64_t)) +
                              3 * part(seqs, sizeof(int32_t)) +
                              part(seqs * graph_max_blocks_per_seq_, sizeof(int32_t)) +
                              part(samples, sizeof(kernels::SampleRequest)) +
                              part(logit_rows, sizeof(int32_t)) +
                              part(samples + logit_rows, sizeof(kernels::LogprobRequest)));
  // Decode graphs replay batches of up to graph_max_batch_ rows: within these bounds. With
  // tensor parallelism, the graphs hold the collectives too (stream-ordered ones only).
  const int64_t max_batch = std::min<int64_t>({graph_max_batch_, tokens, logit_rows});
  if (graphs_ == nullptr && max_batch > 0 && graph_max_blocks_per_seq_ > 0 &&
      (comm_ == nullptr || comm_->stream_ordered()) && backend_->SupportsGraphs()) {
    graphs_ = std::make_unique<DecodeGraphs>(
        backend_, DecodeGraphOptions{static_cast<int>(max_batch), graph_max_blocks_per_seq_});
  }
}

void Model::StageAdjustments(const ForwardBatch& b) {
  kernels::AdjustLogitsParams& p = scratch_.adjust_params;
  p = {};
  if (shard_.rank != 0 || b.adjustments.empty()) return;
  std::vector<uint8_t>& host = scratch_.adjust_host;
  host.clear();
  const size_t rows_at = Pack(b.adjustments, host), allowed_at = Pack(b.allowed_ids, host),
               biases_at = Pack(b.biases, host), counts_at = Pack(b.token_counts, host),
               masks_at = Pack(b.mask_words, host);
  uint8_t* lists = Reserve(scratch_.adjust, host.size());
  backend_->Upload(lists, host.data(), host.size());
  p.vocab = config_.vocab_size;
  p.shard_vocab = vocab_shard_;
  p.rows = reinterpret_cast<const kernels::LogitsAdjustment*>(lists + rows_at);
  p.num_adjustments = static_cast<int64_t>(b.adjustments.size());
  p.allowed_ids = reinterpret_cast<const int32_t*>(lists + allowed_at);
  p.biases = reinterpret_cast<const kernels::TokenBias*>(lists + biases_at);
  p.counts = reinterpret_cast<const kernels::TokenCount*>(lists + counts_at);
  p.mask_words = reinterpret_cast<const uint32_t*>(lists + masks_at);
}

void Model::Draw(const ForwardBatch& b, const float* logits, int64_t rows,
                 const kernels::SampleRequest* samples,
                 const kernels::LogprobRequest* logprob_requests, ForwardOutput* out) {
  // The results in one backend array, so they come back in one copy: the tokens, then per
  // logprobs request its logprob, rank, kMaxTopLogprobs ids and kMaxTopLogprobs values.
  constexpr int kTop = kernels::kMaxTopLogprobs;
  const auto n = static_cast<int64_t>(b.samples.size());
  const auto num = static_cast<int64_t>(b.logprobs.size());
  const int64_t words = n + num * kLogprobWords;
  uint32_t* results = Reserve(scratch_.results, words);
  // The logits are this step's own scratch: adjusted where they lie.
  if (kernels::AdjustLogitsParams a = scratch_.adjust_params; a.num_adjustments > 0) {
    if (b.fill_masks) {  // the masks left to now, over the zeros staged for them
      std::vector<uint32_t>& words = scratch_.late_masks;
      words = b.mask_words;
      b.fill_masks(words);
      backend_->Upload(const_cast<uint32_t*>(a.mask_words), words.data(),
                       words.size() * sizeof(uint32_t));
    }
    a.logits = const_cast<float*>(logits);
    a.num_rows = rows;
    backend_->AdjustLogits(a);
  }
  kernels::SampleParams sp;
  sp.logits = logits;
  sp.num_rows = rows;
  sp.vocab = config_.vocab_size;
  sp.shard_vocab = vocab_shard_;
  sp.requests = samples;
  sp.num_requests = n;
  sp.tokens = reinterpret_cast<int32_t*>(results);
  if (n > 0) backend_->Sample(sp);
  uint32_t* lp_words = results + n;
  if (num > 0) {
    kernels::LogprobsParams lp;
    lp.logits = logits;
    lp.num_rows = rows;
    lp.vocab = config_.vocab_size;
    lp.shard_vocab = vocab_shard_;
    lp.tokens = sp.tokens;
    lp.requests = logprob_requests;
    lp.num_requests = num;
    lp.logprob = reinterpret_cast<float*>(lp_words);
    lp.rank = reinterpret_cast<int32_t*>(lp_words + num);
    lp.top_ids = reinterpret_cast<int32_t*>(lp_words + num * 2);
    lp.top_logprobs = reinterpret_cast<float*>(lp_words + num * (2 + kTop));
    backend_->Logprobs(lp);
  }
  Lap(&ForwardTimes::launch);
  // A logprobs request for more than kMaxTopLogprobs alternatives (up to the whole vocabulary)
  // is ranked on the host, from its adjusted row brought back whole (never in an async step).
  std::vector<int32_t> wide;
  for (const kernels::LogprobRequest& q : b.logprobs) {
    if (q.top_n > kTop) wide.push_back(q.row);
  }
  if (!wide.empty()) {
    CHECK(!b.async_results) << "a step with wide logprobs ran ahead";
    scratch_.wide_rows.resize(wide.size() * config_.vocab_size);
    DownloadRows(logits, rows, wide, scratch_.wide_rows.data());
  }
  if (b.async_results) {  // into pinned memory; Collect waits and unpacks
    const int slot = scratch_.next_results_slot;
    scratch_.next_results_slot ^= 1;
    kernels::Buffer<uint32_t>& pinned = scratch_.results_pinned[slot];
    if (pinned.size() < static_cast<size_t>(words)) {
      pinned = kernels::Buffer<uint32_t>(backend_, std::max<size_t>(words, 2 * pinned.size()),
                                         /*host=*/true);
    }
    out->in_flight = true;
    out->results_slot = slot;
    out->download_ticket =
        backend_->StartDownload(pinned.data(), results, sizeof(uint32_t) * words);
    return;
  }
  std::vector<uint32_t>& host = scratch_.results_host;
  host.resize(words);
  backend_->Download(host.data(), results, sizeof(uint32_t) * words);
  UnpackResults(b, host.data(), out);
  Lap(&ForwardTimes::download);
}

void Model::Collect(const ForwardBatch& b, ForwardOutput& out) {
  if (!out.in_flight) return;
  backend_->WaitDownload(out.download_ticket);
  UnpackResults(b, scratch_.results_pinned[out.results_slot].data(), &out);
  out.in_flight = false;
}

void Model::GatherPending(const ForwardBatch& b, const int32_t* token_ids) {
  const auto n = static_cast<int64_t>(b.pending_rows.size());
  if (n == 0) return;
  // The previous step's tokens lead its results (Draw): nothing has written them since.
  backend_->GatherTokens({.dst = const_cast<int32_t*>(token_ids),
                          .src = reinterpret_cast<const int32_t*>(scratch_.results.data()),
                          .rows = scratch_.pending.data(),
                          .from = scratch_.pending.data() + n,
                          .n = n});
}

void Model::UnpackResults(const ForwardBatch& b, const uint32_t* host, ForwardOutput* out) const {
  constexpr int kTop = kernels::kMaxTopLogprobs;
  const auto n = static_cast<int64_t>(b.samples.size());
  const auto num = static_cast<int64_t>(b.logprobs.size());
  out->tokens.resize(n);
  std::memcpy(out->tokens.data(), host, sizeof(int32_t) * n);
  const uint32_t* h = host + n;
  const int64_t vocab = config_.vocab_size;
  const float* wide_row = scratch_.wide_rows.data();
  for (int64_t k = 0; k < num; ++k) {
    const kernels::LogprobRequest& q = b.logprobs[k];
    TokenLogprobs t;
    t.token = q.sample >= 0 ? out->tokens[q.sample] : q.token;
    if (q.top_n > kTop) {  // Draw's: the row ranked here, by the CPU backend's rule
      const int top_n = static_cast<int>(std::min<int64_t>(q.top_n, vocab));
      std::vector<int32_t> ids(top_n);
      std::vector<float> values(top_n);
      kernels::cpu::TopLogprobs(wide_row, vocab, t.token, top_n, &t.logprob, &t.rank, ids.data(),
                                values.data());
      wide_row += vocab;
      t.top.reserve(top_n);
      for (int i = 0; i < top_n; ++i) t.top.emplace_back(ids[i], values[i]);
      out->logprobs.push_back(std::move(t));
      continue;
    }
    std::memcpy(&t.logprob, h + k, sizeof(float));
    std::memcpy(&t.rank, h + num + k, sizeof(int32_t));
    for (int i = 0; i < std::min<int64_t>(q.top_n, config_.vocab_size); ++i) {
      int32_t id;
      float value;
      std::memcpy(&id, h + num * 2 + k * kTop + i, sizeof(id));
      std::memcpy(&value, h + num * (2 + kTop) + k * kTop + i, sizeof(value));
      t.top.emplace_back(id, value);
    }
    out->logprobs.push_back(std::move(t));
  }
}

absl::Status Model::AllReduce(float* data, size_t count) {
  if (void* stream = backend_->OpStream(); stream != nullptr && comm_->stream_ordered()) {
    return comm_->EnqueueAllReduceSum(data, count, stream);
  }
  backend_->Synchronize();  // the collective runs on its own stream
  return comm_->AllReduceSum(data, count);
}

absl::Status Model::AllGather(const float* in, size_t count, float* out) {
  if (void* stream = backend_->OpStream(); stream != nullptr && comm_->stream_ordered()) {
    return comm_->EnqueueAllGather(in, count, out, stream);
  }
  backend_->Synchronize();
  return comm_->AllGather(in, count, out);
}

absl::StatusOr<ForwardOutput> Model::Forward(const ForwardBatch& b, KvStorage& kv) {
  timing_ = b.time_phases;
  times_ = {};
  if (timing_) phase_clock_.Lap();
  absl::StatusOr<ForwardOutput> out = RunForward(b, kv);
  if (out.ok()) out->times = times_;
  timing_ = false;
  return out;
}

absl::StatusOr<ForwardOutput> Model::RunForward(const ForwardBatch& b, KvStorage& kv) {
  // The logits adjustments first: their lists go up with the batch, in stream order.
  StageAdjustments(b);
  if (!b.pending_rows.empty()) {  // rows, then their samples, in one upload
    std::vector<int32_t>& host = scratch_.pending_host;
    host.assign(b.pending_rows.begin(), b.pending_rows.end());
    host.insert(host.end(), b.pending_from.begin(), b.pending_from.end());
    backend_->Upload(Reserve(scratch_.pending, host.size()), host.data(),
                     sizeof(int32_t) * host.size());
  }
  if (graphs_ != nullptr && !b.after_kv_write && graphs_->Fits(b)) return ForwardGraph(b, kv);
  Scratch& s = scratch_;
  // The batch, packed (8-byte aligned parts) and uploaded in one copy.
  s.batch_host.clear();
  auto pack = [&](const auto& v) { return Pack(v, s.batch_host); };
  const size_t token_ids_at = pack(b.token_ids), positions_at = pack(b.positions),
               slots_at = pack(b.slot_mapping), query_start_at = pack(b.query_start),
               query_len_at = pack(b.query_len), context_len_at = pack(b.context_len),
               block_tables_at = pack(b.block_tables), samples_at = pack(b.samples),
               logit_rows_at = pack(b.logit_rows), logprobs_at = pack(b.logprobs);
  uint8_t* batch = Reserve(s.batch, s.batch_host.size());
  backend_->Upload(batch, s.batch_host.data(), s.batch_host.size());
  StepInputs in;
  in.token_ids = reinterpret_cast<const int32_t*>(batch + token_ids_at);
  in.positions = reinterpret_cast<const int32_t*>(batch + positions_at);
  in.slot_mapping = reinterpret_cast<const int64_t*>(batch + slots_at);
  in.query_start = reinterpret_cast<const int32_t*>(batch + query_start_at);
  in.query_len = reinterpret_cast<const int32_t*>(batch + query_len_at);
  in.context_len = reinterpret_cast<const int32_t*>(batch + context_len_at);
  in.block_tables = reinterpret_cast<const int32_t*>(batch + block_tables_at);
  in.logit_rows = reinterpret_cast<const int32_t*>(batch + logit_rows_at);
  in.tokens = static_cast<int64_t>(b.token_ids.size());
  in.num_seqs = static_cast<int64_t>(b.query_start.size());
  in.max_blocks_per_seq = b.max_blocks_per_seq;
  in.num_logit_rows = static_cast<int64_t>(b.logit_rows.size());
  in.max_query_len =
      b.query_len.empty() ? 0 : *std::max_element(b.query_len.begin(), b.query_len.end());
  in.max_context_len =
      b.context_len.empty() ? 0 : *std::max_element(b.context_len.begin(), b.context_len.end());
  const auto* samples = reinterpret_cast<const kernels::SampleRequest*>(batch + samples_at);
  const auto* logprob_requests =
      reinterpret_cast<const kernels::LogprobRequest*>(batch + logprobs_at);
  GatherPending(b, in.token_ids);
  after_kv_write_ = b.after_kv_write ? &b.after_kv_write : nullptr;
  Lap(&ForwardTimes::inputs);
  absl::StatusOr<const float*> logits = RunModel(in, kv);
  after_kv_write_ = nullptr;
  RETURN_IF_ERROR(logits.status());
  return Finish(b, *logits, in.num_logit_rows, samples, logprob_requests);
}

absl::StatusOr<ForwardOutput> Model::ForwardGraph(const ForwardBatch& b, KvStorage& kv) {
  const kernels::KvCacheView cache = kv.View(0);
  const DecodeGraphs::Step step = graphs_->Prepare(b, cache.block_size, cache.k);
  GatherPending(b, step.inputs.token_ids);
  Lap(&ForwardTimes::inputs);
  if (const DecodeGraphs::Recorded r = graphs_->Find(step);
      r.graph >= 0 && backend_->ReplayGraph(r.graph)) {
    // The replay's collectives, bounded by the timeout like the eager steps' (and on every
    // rank, replaying or not, the same ones in the same order).
    if (comm_ != nullptr) RETURN_IF_ERROR(comm_->EnqueueWatch(backend_->OpStream()));
    ASSIGN_OR_RETURN(ForwardOutput out,
                     Finish(b, r.logits, step.inputs.num_logit_rows, step.samples, step.logprobs));
    out.graph = true;
    return out;
  }
  // No graph for this bucket yet (or the backend dropped it): run the step, which also sizes
  // the backend's scratch memory for these ops, then record them for the next steps. Recording
  // runs nothing, so the logits stay this step's. Out of memory for the graph, the step goes
  // on without it, and so do the later ones. (Ranks may differ in what they record: eager or
  // replayed, their collectives are the same ones in the same order.)
  graphs_->MakeRoom();
  ASSIGN_OR_RETURN(const float* logits, RunModel(step.inputs, kv));
  bool recorded = false;
  if (graphs_->recording()) {
    const absl::StatusOr<int64_t> graph = RecordGraph(step.inputs, kv, logits);
    if (graph.ok()) {
      graphs_->Record(step, {*graph, logits});
      recorded = true;
    } else if (absl::IsResourceExhausted(graph.status())) {
      LOG(WARNING) << "decode graphs: recording stopped with " << graphs_->size()
                   << " recorded (the other batch sizes run eagerly): " << graph.status();
      graphs_->StopRecording(graph.status());
    } else {
      return graph.status();
    }
  }
  ASSIGN_OR_RETURN(ForwardOutput out,
                   Finish(b, logits, step.inputs.num_logit_rows, step.samples, step.logprobs));
  out.recorded_graph = recorded;
  return out;
}

absl::StatusOr<int64_t> Model::RecordGraph(const StepInputs& in, KvStorage& kv,
                                           const float* logits) {
  RETURN_IF_ERROR(backend_->BeginGraph());
  const absl::StatusOr<const float*> recorded = RunModel(in, kv);
  absl::StatusOr<int64_t> graph = backend_->EndGraph();
  RETURN_IF_ERROR(recorded.status());
  CHECK_EQ(*recorded, logits) << "a decode graph's logits moved";
  return graph;
}

absl::Status Model::graphs_stopped() const {
  return graphs_ != nullptr ? graphs_->stopped() : absl::OkStatus();
}

void Model::DownloadRows(const float* logits, int64_t rows, absl::Span<const int32_t> which,
                         float* out) {
  // Gathered (whole rows, from every rank's slice) into a fixed buffer and brought back a few
  // rows at a time.
  const int64_t vocab = config_.vocab_size, vs = vocab_shard_;
  const auto n = static_cast<int64_t>(which.size());
  const int64_t per_copy = HostRowsPerCopy();
  float* host_rows = Reserve(scratch_.host_rows, per_copy * vocab);
  for (int64_t k0 = 0; k0 < n; k0 += per_copy) {
    const int64_t m = std::min(per_copy, n - k0);
    for (int64_t k = 0; k < m; ++k) {
      const int64_t r = which[k0 + k];
      for (int64_t v0 = 0; v0 < vocab; v0 += vs) {
        backend_->Copy(host_rows + k * vocab + v0, logits + (v0 / vs) * rows * vs + r * vs,
                       sizeof(float) * std::min(vs, vocab - v0));
      }
    }
    backend_->Download(out + k0 * vocab, host_rows, sizeof(float) * m * vocab);
  }
}

absl::StatusOr<ForwardOutput> Model::Finish(const ForwardBatch& b, const float* logits,
                                            int64_t rows, const kernels::SampleRequest* samples,
                                            const kernels::LogprobRequest* logprob_requests) {
  ForwardOutput out;
  // A tensor-parallel step ends with its collectives done (or failed) on every rank: waited
  // for here where nothing is downloaded below, by the downloads otherwise. (That also runs an
  // emulated device, whose queued work runs only when something waits for it.)
  const bool draws = !b.samples.empty() || !b.logprobs.empty();
  const bool downloads = shard_.rank == 0 && (draws || !b.host_logit_rows.empty());
  Lap(&ForwardTimes::launch);
  if (comm_ != nullptr && !downloads) backend_->Synchronize();
  // The prompt logits first: the draw's adjustments change the rows it reads.
  if (shard_.rank == 0 && !b.host_logit_rows.empty()) {
    out.logits.resize(b.host_logit_rows.size() * config_.vocab_size);
    DownloadRows(logits, rows, b.host_logit_rows, out.logits.data());
  }
  Lap(&ForwardTimes::download);
  if (shard_.rank == 0 && draws) {
    Draw(b, logits, rows, samples, logprob_requests, &out);
  }
  // Collectives that a peer's stall or failure aborted meanwhile leave garbage in the logits:
  // the step fails instead of returning what was drawn from them.
  if (comm_ != nullptr) RETURN_IF_ERROR(comm_->status());
  return out;
}

}  // namespace kvserve::worker
