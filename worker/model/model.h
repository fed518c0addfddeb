// A Llama-family decoder (llama, mistral, qwen2, qwen3) executed through a kernels::Backend
// over a paged KV cache. Loads Hugging Face checkpoints (F32/F16/BF16), keeping the matrices
// (projections, embedding, LM head) in the weight type asked for (float32, bf16 or fp16; norms
// and biases stay float32), fusing q/k/v and gate/up projections into one GEMM each; weights,
// activations and the batch live in the backend's memory (the GPU's for the CUDA backend); tokens
// are drawn there too, and only they (and the logits rows asked for) come back.
//
//   ASSIGN_OR_RETURN(auto model, Model::Load(dir, config, backend.get()));
//   ASSIGN_OR_RETURN(ForwardOutput out, model->Forward(batch, kv));  // out.tokens[i]: samples[i]
//
// Used by the engine thread only.
#ifndef KVSERVE_WORKER_MODEL_MODEL_H_
#define KVSERVE_WORKER_MODEL_MODEL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/model/hf_config.h"
#include "kernels/backend.h"
#include "kernels/buffer.h"
#include "kernels/communicator.h"
#include "worker/kv_cache/kv_storage.h"
#include "worker/model/step_inputs.h"
#include "worker/model/step_profile.h"
#include "worker/request/request.h"

namespace kvserve::worker {

class WeightReader;

// One forward pass over a flat batch of tokens from several sequences.
struct ForwardBatch {
  std::vector<int32_t> token_ids;     // [T]
  std::vector<int32_t> positions;     // [T]
  std::vector<int64_t> slot_mapping;  // [T]: block * block_size + offset
  std::vector<int32_t> query_start;   // [S]
  std::vector<int32_t> query_len;     // [S]
  std::vector<int32_t> context_len;   // [S]: tokens in the cache after this pass
  std::vector<int32_t> block_tables;  // [S, max_blocks_per_seq]
  int max_blocks_per_seq = 0;
  std::vector<int32_t> logit_rows;  // token rows whose logits are computed
  // Tokens to draw on the backend; each request's `row` indexes logit_rows.
  std::vector<kernels::SampleRequest> samples;
  // Logprobs of drawn tokens (each `sample` indexes samples) and of given ones (a prompt's),
  // computed on the backend.
  std::vector<kernels::LogprobRequest> logprobs;
  // Changes to logits rows before the draw and the logprobs (penalties, biases, bans, allowed
  // ids: kernels/logits_processing.h), with the lists their ranges index.
  std::vector<kernels::LogitsAdjustment> adjustments;
  std::vector<int32_t> allowed_ids;
  std::vector<kernels::TokenBias> biases;
  std::vector<kernels::TokenCount> token_counts;
  std::vector<uint32_t> mask_words;  // allowed-token bitmasks (structured outputs)
  // When set, some masks of mask_words are left to it: rank 0 calls it with a copy of
  // mask_words once the step's model ops are queued (a device runs the forward pass
  // meanwhile), and adjusts the logits with what it filled in.
  std::function<void(std::vector<uint32_t>& mask_words)> fill_masks;
  // Indexes into logit_rows of the rows whose logits come back (prompt logits).
  std::vector<int32_t> host_logit_rows;
  // When set, each rank calls it (on its thread) with its rank and a layer as soon as that
  // layer's KV writes are queued, before the layer's attention (layer streaming: the engine
  // queues the layer's sends behind them). Such a step never replays a decode graph.
  std::function<void(int rank, int layer)> after_kv_write;
  // Rank 0 times its phases into ForwardOutput::times (the engine's step profile).
  bool time_phases = false;
  // Async scheduling. Rows whose token is the previous step's draw, which the host does not know
  // yet: token_ids[pending_rows[i]] is a placeholder that the model replaces, on the device,
  // with that step's sample pending_from[i] (Backend::GatherTokens).
  std::vector<int32_t> pending_rows, pending_from;
  // The draw's results stay in flight: Forward returns once the step is queued
  // (ForwardOutput::in_flight) and Model::Collect completes the output. Rank 0, no host logits
  // rows, no more than one such step between collects.
  bool async_results = false;
};

struct ForwardOutput {
  std::vector<int32_t> tokens;          // one per ForwardBatch::samples entry
  std::vector<TokenLogprobs> logprobs;  // one per ForwardBatch::logprobs entry
  std::vector<float> logits;            // [host_logit_rows.size(), vocab]
  bool graph = false;                   // the step replayed a decode graph
  bool recorded_graph = false;          // the step ran eagerly and recorded its decode graph
  double sim_seconds = 0;               // --device sim: the step's time on the simulated GPU
  ForwardTimes times;                   // rank 0's, when ForwardBatch::time_phases
  // An async_results step whose tokens and logprobs are still on their way (Model::Collect).
  bool in_flight = false;
  int64_t download_ticket = -1;  // Backend::StartDownload's
  int results_slot = 0;          // the pinned buffer they land in
};

// Which part of the model a tensor-parallel rank holds: query heads [rank·heads/size, ...),
// the KV heads they read (a slice, or one whole head replicated when kv_heads < size), a slice
// of the MLP's intermediate dimension and of the vocabulary (LM head). Embeddings and norms
// are replicated.
struct TpShard {
  int rank = 0;
  int size = 1;
};

struct ModelLoadOptions {
  TpShard shard;
  kernels::Communicator* comm = nullptr;  // required when shard.size > 1
  DType weight_type = DType::kF32;        // of the matrices: kF32, kBF16 or kF16
  // Decode steps of up to this many sequences replay recorded graphs (decode_graphs.h) where
  // the backend records them (with a stream-ordered `comm` when sharded); 0: never.
  int graph_max_batch = 0;
  int graph_max_blocks_per_seq = 0;  // the block tables' widest width (max_model_len's)
};

class DecodeGraphs;

class Model {
 public:
  // InvalidArgument naming the tensor when the checkpoint does not fit the config, or naming
  // --tensor-parallel-size when the shapes do not split.
  static absl::StatusOr<std::unique_ptr<Model>> Load(const std::string& dir,
                                                     const ModelConfig& config,
                                                     kernels::Backend* backend,
                                                     const ModelLoadOptions& options = {});
  // InvalidArgument when `config` cannot be split `size` ways.
  static absl::Status CheckShardable(const ModelConfig& config, int size);
  // KV heads a rank stores: kv_heads / size, or 1 when the heads are replicated.
  static int LocalKvHeads(const ModelConfig& config, int size);

  // Runs the batch, writing its K/V into (and reading context from) `kv`, which holds this
  // rank's KV heads, and draws its samples. Every rank of a group calls it with the same batch;
  // rank 0 gets the output (the others an empty one). Fails only when a collective does (a peer
  // errored or stalled). With graph_max_batch, a decode step replays a graph where it can.
  absl::StatusOr<ForwardOutput> Forward(const ForwardBatch& batch, KvStorage& kv);
  // Completes an output that Forward left in flight (ForwardBatch::async_results): waits for
  // its results and unpacks them. `batch` is the step's.
  void Collect(const ForwardBatch& batch, ForwardOutput& out);

  // Allocates the buffers of the largest step (`tokens`, `logit_rows`, `samples`, `context`),
  // the backend's scratch and the decode graphs' inputs included, so that the KV pool is sized
  // after them and steps within these bounds allocate nothing.
  void ReserveScratch(int64_t tokens, int64_t logit_rows, int64_t samples, int64_t context);

  ~Model();

  [[nodiscard]] const ModelConfig& config() const { return config_; }
  // Bytes of the weights as loaded.
  [[nodiscard]] int64_t weight_bytes() const { return weight_bytes_; }
  [[nodiscard]] DType weight_type() const { return weight_type_; }
  // Why the decode graphs stopped recording (the device ran out of memory for them: the
  // buckets left run eagerly); OK while they record, or without graphs.
  [[nodiscard]] absl::Status graphs_stopped() const;

 private:
  // A matrix in weight_type_, in the backend's memory.
  using Matrix = kernels::Buffer<uint8_t>;
  // A layer's weights in the backend's memory (vectors in float32).
  struct Layer {
    kernels::Buffer<float> input_norm, post_norm;
    Matrix qkv;                             // [(q + 2 kv) × hidden]
    kernels::Buffer<float> qkv_bias;        // empty when absent
    kernels::Buffer<float> q_norm, k_norm;  // qwen3
    Matrix o;
    kernels::Buffer<float> o_bias;
    Matrix gate_up;  // [2 inter × hidden]
    kernels::Buffer<float> gate_up_bias;
    Matrix down;
    kernels::Buffer<float> down_bias;
  };
  // Per-step buffers in backend memory, grown as batches grow (never shrunk).
  struct Scratch {
    // The step's batch (token ids, positions, slots, sequence lengths, block tables) packed
    // into one array, so it crosses to the backend in a single copy.
    std::vector<uint8_t> batch_host;
    kernels::Buffer<uint8_t> batch;
    kernels::Buffer<float> delta, residual, h, qkv, attn, gate_up, act, selected, local, gathered;
    kernels::Buffer<float> residual_alt;  // DecodeGemv steps' residuals alternate with residual
    kernels::Buffer<uint16_t> h16, attn16, act16;  // with 16-bit weights: Gemm inputs, rounded
    kernels::Buffer<float> host_rows;              // logits rows that come back, gathered
    // The adjusted logits rows of the step's wide logprobs requests (Draw), [n][vocab].
    std::vector<float> wide_rows;
    kernels::Buffer<uint32_t> results;  // drawn tokens and logprobs (Draw)
    std::vector<uint32_t> results_host;
    // Async scheduling: in-flight results land in pinned memory, two steps' apart
    // (next_results_slot), and the pending rows' lists go up here.
    kernels::Buffer<uint32_t> results_pinned[2];
    int next_results_slot = 0;
    kernels::Buffer<int32_t> pending;
    std::vector<int32_t> pending_host;
    std::vector<uint8_t> adjust_host;           // the logits adjustments' lists, packed
    kernels::Buffer<uint8_t> adjust;            // and uploaded (StageAdjustments)
    kernels::AdjustLogitsParams adjust_params;  // the step's, but for the logits
    std::vector<uint32_t> late_masks;           // mask_words as fill_masks completes them
  };
  // buf, grown to at least n entries; the decode graphs keep the old one when they read it
  // (graphs_use).
  template <typename T>
  T* Reserve(kernels::Buffer<T>& buf, size_t n, bool graphs_use = false);
  // attn and act are null with 16-bit weights (attn16 and act16 instead); the 16-bit ones are
  // null with float32 weights.
  struct Activations {
    float *delta, *residual, *h, *qkv, *attn, *gate_up, *act;
    uint16_t *h16, *attn16, *act16;
    float* residual_alt;  // null unless the step can use DecodeGemv
  };
  Activations ReserveActivations(int64_t tokens);
  struct LogitBuffers {
    float *selected, *local, *gathered;  // gathered: null without a communicator
  };
  LogitBuffers ReserveLogits(int64_t rows);
  // Logits rows gathered per download (prompt logits): as many as fit kHostRowsBytes, at
  // least one.
  static constexpr int64_t kHostRowsBytes = int64_t{8} << 20;
  [[nodiscard]] int64_t HostRowsPerCopy() const {
    return std::max<int64_t>(1, kHostRowsBytes / (int64_t{4} * config_.vocab_size));
  }
  // The tensor-parallel sum of a layer's partial output, in place: on the backend's own stream
  // where the communicator can order it there (NCCL on the GPU: no host round trip per
  // layer), else after the backend's queued ops.
  absl::Status AllReduce(float* data, size_t count);
  // The ranks' slices of the logits gathered, the same way.
  absl::Status AllGather(const float* in, size_t count, float* out);
  // Issues the step's ops from the embeddings to the logits, gathered across ranks (the part
  // a decode graph records): returns where the logits are, [num_logit_rows][vocab] laid out as
  // SampleParams says.
  absl::StatusOr<const float*> RunModel(const StepInputs& in, KvStorage& kv);
  // Whether a step of `tokens` runs its layers through Backend::DecodeGemv (16-bit weights, few
  // enough rows for the backend).
  [[nodiscard]] bool UsesDecodeGemv(int64_t tokens) const;
  // RunModel's layers, from the embeddings in a.delta, with each layer's norms, projections and
  // SiLU·mul as four DecodeGemv ops (6 launches a layer with the KV write and attention):
  // returns the buffer that holds the residual stream after the last layer (a.residual or
  // a.residual_alt; a.delta holds the last layer's output).
  absl::StatusOr<float*> RunLayersGemv(const StepInputs& in, KvStorage& kv, const Activations& a);
  // Forward without the phase timing around it.
  absl::StatusOr<ForwardOutput> RunForward(const ForwardBatch& b, KvStorage& kv);
  // Paged attention of one layer: the step's queries (rows of `qkv_stride` in `qkv`) against
  // `cache`, into attn (float32 weights) or attn16 (16-bit weights).
  // A layer's q and k after their per-head norms (qwen3) and the rotary embedding, and the k
  // and v rows written to the layer's cache.
  void RotateAndStore(const StepInputs& in, const Layer& L, const kernels::KvCacheView& cache,
                      float* qkv);
  void Attend(const StepInputs& in, const kernels::KvCacheView& cache, const float* qkv,
              int64_t qkv_stride, float* attn, uint16_t* attn16);
  // The logits rows of the final hidden states `h`, gathered across ranks (RunModel's end).
  absl::StatusOr<const float*> Logits(const StepInputs& in, const float* h);
  // Forward for a batch that DecodeGraphs::Fits: replays its bucket's graph, or runs the step
  // and records the graph for the next ones (unless recording has stopped).
  absl::StatusOr<ForwardOutput> ForwardGraph(const ForwardBatch& b, KvStorage& kv);
  // Records `in`'s ops as a graph, whose logits must land at `logits`: the backend's graph id,
  // or ResourceExhausted when the device has no memory for it (nothing recorded then).
  absl::StatusOr<int64_t> RecordGraph(const StepInputs& in, KvStorage& kv, const float* logits);
  // The end of a step: draws the samples and brings back the logits rows asked for (rank 0);
  // an error when the step's collectives were aborted (their outputs are garbage then).
  absl::StatusOr<ForwardOutput> Finish(const ForwardBatch& b, const float* logits, int64_t rows,
                                       const kernels::SampleRequest* samples,
                                       const kernels::LogprobRequest* logprob_requests);
  // Uploads the batch's logits adjustments (rank 0, which draws) into scratch_.adjust_params,
  // which Draw then applies to the step's logits in place; clears them for a batch without.
  void StageAdjustments(const ForwardBatch& b);
  // Draws the batch's samples from `logits` (`rows` rows, sliced when the LM head is) and
  // computes the logprobs asked for, into out->tokens and out->logprobs.
  void Draw(const ForwardBatch& b, const float* logits, int64_t rows,
            const kernels::SampleRequest* samples, const kernels::LogprobRequest* logprob_requests,
            ForwardOutput* out);
  // The draw's results (tokens, then logprobs as Draw lays them out) from host memory; a wide
  // logprobs request's from its row in scratch_.wide_rows.
  void UnpackResults(const ForwardBatch& b, const uint32_t* host, ForwardOutput* out) const;
  // Logits rows `which` (indexes into the `rows` rows at `logits`, laid out as SampleParams
  // says) gathered whole into host memory, [which.size()][vocab], a few rows per download.
  void DownloadRows(const float* logits, int64_t rows, absl::Span<const int32_t> which, float* out);
  // The pending rows' tokens from the previous step's draw, into `token_ids` (backend memory).
  void GatherPending(const ForwardBatch& b, const int32_t* token_ids);

  Model(const ModelConfig& config, kernels::Backend* backend, const ModelLoadOptions& options);
  // Where this rank's slices start: its first query head, KV head and MLP row.
  struct ShardOrigin {
    int q0 = 0, kv0 = 0, i0 = 0;
  };
  // Layer `l`'s weights of this shard into layers_[l].
  absl::Status LoadLayer(const WeightReader& read, int l, const ShardOrigin& at);
  // Into the backend's memory, counted in weight_bytes_: vectors as float32, matrices as read.
  kernels::Buffer<float> Upload(const std::vector<float>& v);
  Matrix UploadMatrix(const std::vector<uint8_t>& bytes);

  ModelConfig config_;
  kernels::Backend* backend_;
  TpShard shard_;
  // The eager step's ForwardBatch::after_kv_write while RunModel runs (null otherwise).
  const std::function<void(int, int)>* after_kv_write_ = nullptr;
  kernels::Communicator* comm_;
  DType weight_type_;
  int graph_max_batch_, graph_max_blocks_per_seq_;
  std::unique_ptr<DecodeGraphs> graphs_;      // null without graphs
  int heads_ = 0, kv_heads_ = 0, inter_ = 0;  // this rank's share
  int vocab_shard_ = 0;                       // LM-head rows per rank (padded)
  Matrix embed_, lm_head_;                    // lm_head_ empty when tied
  kernels::Buffer<float> final_norm_;
  std::vector<Layer> layers_;
  kernels::Buffer<float> inv_freq_;
  Scratch scratch_;
  int64_t weight_bytes_ = 0;
  // The step's phase times while a ForwardBatch::time_phases step runs (timing_ set), each lap
  // added to one of them (Lap).
  bool timing_ = false;
  ForwardTimes times_;
  PhaseClock phase_clock_;
  void Lap(double ForwardTimes::*phase) {
    if (timing_) times_.*phase += phase_clock_.Lap();
  }
};

}  // namespace kvserve::worker

#endif  // KVSERVE_WORKER_MODEL_MODEL_H_
