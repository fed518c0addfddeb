// Decode steps as recorded graphs (CUDA graphs), like vLLM's and SGLang's: a step whose
// sequences each decode one token runs the model, from the embeddings to the logits, as one
// graph launch instead of ~10 launches per layer. A graph is recorded per (batch bucket,
// block-table width bucket) and replays with whatever its fixed input buffer holds: the step
// is padded to its bucket (padding rows write no KV, attend to nothing and draw nothing) and
// its block tables are laid out at the bucket's width, which also bounds the context the
// attention kernel is planned for. Sampling stays outside the graph. The model runner records
// every bucket at start-up (ModelRunner::RecordDecodeGraphs); a buffer the graphs read that
// an eager step outgrows stays theirs (Keep), so they last until the KV storage changes.
//
//   DecodeGraphs graphs(backend, {.max_batch = 64, .max_blocks_per_seq = 256});
//   if (graphs.Fits(batch)) {
//     DecodeGraphs::Step step = graphs.Prepare(batch, block_size, cache_id);  // uploads
//     DecodeGraphs::Recorded r = graphs.Find(step);
//     if (r.graph < 0 || !backend->ReplayGraph(r.graph)) { ...run, record, graphs.Record... }
//   }
//
// Used by the model on the engine thread only.
#ifndef KVSERVE_WORKER_MODEL_DECODE_GRAPHS_H_
#define KVSERVE_WORKER_MODEL_DECODE_GRAPHS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "kernels/backend.h"
#include "kernels/buffer.h"
#include "worker/model/model.h"
#include "worker/model/step_inputs.h"

namespace kvserve::worker {

struct DecodeGraphOptions {
  int max_batch = 0;           // the largest batch replayed (the last bucket); 0: no graphs
  int max_blocks_per_seq = 0;  // block-table width of the widest bucket (max_model_len's)
};

class DecodeGraphs {
 public:
  // The batch buckets: 1, 2, 4, then multiples of 8, and max_batch last.
  static int64_t BatchBucket(int64_t seqs, int64_t max_batch);
  // The width buckets: powers of two from kMinWidth, and max_blocks_per_seq last.
  static int64_t WidthBucket(int64_t blocks, int64_t max_blocks_per_seq);
  static constexpr int64_t kMinWidth = 8;
  // Every bucket, the largest batch and width first: the order to record them in, so that the
  // first recording sizes the scratch memory for all.
  static std::vector<std::pair<int64_t, int64_t>> Buckets(int64_t max_batch,
                                                          int64_t max_blocks_per_seq);
  // Beyond this many recorded graphs, all are dropped and recording starts again.
  static constexpr size_t kMaxGraphs = 512;

  // Allocates the fixed input buffer (backend and host memory) for the largest bucket.
  DecodeGraphs(kernels::Backend* backend, const DecodeGraphOptions& options);

  // Whether `b` can run as a replay: every sequence decodes one token whose logits row is
  // sampled (rows in sequence order), no prompt logits come back, and it fits the largest
  // bucket.
  [[nodiscard]] bool Fits(const ForwardBatch& b) const;

  using Bucket = std::pair<int64_t, int64_t>;  // (batch, width)
  struct Step {
    StepInputs inputs;  // padded to the bucket, in the fixed buffer
    const kernels::SampleRequest* samples = nullptr;
    const kernels::LogprobRequest* logprobs = nullptr;
    Bucket bucket;
  };
  // Lays out `b` (which Fits) padded to its bucket and uploads it. `cache_id` names the KV
  // storage the graphs write (its first layer's K array): a new one drops every graph.
  Step Prepare(const ForwardBatch& b, int64_t block_size, const void* cache_id);

  // A bucket's graph (the backend's id; -1 until recorded) and where it leaves the logits.
  struct Recorded {
    int64_t graph = -1;
    const float* logits = nullptr;
  };
  [[nodiscard]] Recorded Find(const Step& step) const;
  void Record(const Step& step, const Recorded& recorded) { graphs_[step.bucket] = recorded; }
  // Drops every graph once there are kMaxGraphs of them (call before recording another).
  void MakeRoom();

  // Keeps a buffer the recorded graphs read, which the model has outgrown (a larger one serves
  // the eager steps), until the graphs are dropped.
  void Keep(std::shared_ptr<void> buffer) { kept_.push_back(std::move(buffer)); }

  // Recording stops when the device has no memory for another graph (Backend::BeginGraph or
  // EndGraph failed with `why`): the buckets without a graph run eagerly, the others still
  // replay, until Drop frees the graphs' memory.
  void StopRecording(absl::Status why) { stopped_ = std::move(why); }
  [[nodiscard]] bool recording() const { return stopped_.ok(); }
  // OK while recording; else why it stopped.
  [[nodiscard]] const absl::Status& stopped() const { return stopped_; }

  // Drops every graph, the backend's too, and the buffers kept for them; recording resumes.
  void Drop();
  [[nodiscard]] size_t size() const { return graphs_.size(); }

 private:
  kernels::Backend* backend_;
  DecodeGraphOptions options_;
  // Byte offsets in the buffer: the sampling requests first (their count varies), then the
  // per-row arrays (max_batch entries each) and the block tables, so that a step uploads one
  // prefix of it.
  size_t samples_at_ = 0, logprobs_at_ = 0, token_ids_at_ = 0, positions_at_ = 0, slots_at_ = 0,
         query_start_at_ = 0, query_len_at_ = 0, context_len_at_ = 0, logit_rows_at_ = 0,
         block_tables_at_ = 0;
  std::vector<uint8_t> host_;
  kernels::Buffer<uint8_t> device_;
  std::map<Bucket, Recorded> graphs_;
  std::vector<std::shared_ptr<void>> kept_;
  const void* cache_id_ = nullptr;
  absl::Status stopped_;
};

}  // namespace kvserve::worker

#endif  // KVSERVE_WORKER_MODEL_DECODE_GRAPHS_H_
