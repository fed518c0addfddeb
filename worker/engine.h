// The worker's engine: a model, its paged KV cache, the scheduler and the sampler, driven one
// step at a time. The worker server and the tests drive it through this API.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(config));
//   RETURN_IF_ERROR(engine->AddRequest({.request_id = "r1", .prompt = ids, .max_tokens = 32}));
//   while (engine->HasWork()) {
//     ASSIGN_OR_RETURN(std::vector<SequenceOutput> outs, engine->Step());
//     ...  // new tokens per sample, finish reasons
//   }
//
// Owned by one thread (the engine thread); not thread-safe.
#ifndef KVSERVE_WORKER_ENGINE_H_
#define KVSERVE_WORKER_ENGINE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/kv/kv_format.h"
#include "common/thread_checker.h"
#include "kernels/backend.h"
#include "worker/constraints.h"
#include "worker/engine_config.h"
#include "worker/kv_cache/kv_cache_manager.h"
#include "worker/kv_cache/kv_staging.h"
#include "worker/layer_streamer.h"
#include "worker/model/model.h"
#include "worker/model/step_profile.h"
#include "worker/model_runner.h"
#include "worker/prefix_transfer.h"
#include "worker/preflight.h"
#include "worker/request/request.h"
#include "worker/scheduler/scheduler.h"
#include "worker/step_plan.h"

namespace kvserve::worker {

struct SequenceOutput {
  std::string request_id;
  int sample_index = 0;
  std::vector<int32_t> new_tokens;
  std::vector<TokenLogprobs> new_logprobs;
  FinishReason finish_reason = FinishReason::kNone;
  std::optional<int32_t> stop_token;
  bool request_finished = false;  // every sample of the request is done
  int num_prompt_tokens = 0;
  int num_cached_prompt_tokens = 0;
  std::vector<float> prompt_logits;  // on the request's last output, when asked for
  // On the request's first output, when asked for: entry i for prompt token i + 1.
  std::vector<TokenLogprobs> prompt_logprobs;
};

struct EngineStats {
  int64_t steps = 0;
  int64_t graph_steps = 0;  // steps that replayed a CUDA graph
  int64_t steps_ahead = 0;  // steps left in flight while the next was planned (async scheduling)
  int64_t computed_tokens = 0;  // tokens run through the model (prefill, recompute, decode)
  int64_t computed_prompt_tokens = 0;
  int64_t generated_tokens = 0;
  int64_t jumped_tokens = 0;         // of generated_tokens: appended by jump-forward, not drawn
  int64_t constraints_compiled = 0;  // structured-outputs constraints compiled (cache misses)
  int64_t constraints_reused = 0;    // found compiled (cache hits)
  int64_t constraint_masks_walked = 0;
  int64_t constraint_masks_reused = 0;
  double constraint_mask_seconds = 0;
  int64_t prefix_queried_tokens = 0;
  int64_t prefix_hit_tokens = 0;
  int64_t prefix_hit_tokens_device = 0;
  int64_t prefix_hit_tokens_host = 0;
  int64_t preemptions = 0;
  int64_t swap_preemptions = 0;
  int64_t recompute_preemptions = 0;
  int64_t swap_out_blocks = 0, swap_in_blocks = 0;
  int64_t swap_out_bytes = 0, swap_in_bytes = 0;
  int64_t host_spilled_blocks = 0;
  int64_t cow_copies = 0;
  int64_t evictions = 0;
  int num_running = 0, num_waiting = 0, num_swapped = 0, num_requests = 0;
  int blocks_total = 0, blocks_free = 0, blocks_cached_evictable = 0;
  int host_blocks_total = 0, host_blocks_free = 0, host_blocks_cached_evictable = 0;
  int64_t kv_bytes_per_block = 0;
  double sim_busy_seconds = 0;  // --device sim: the simulated GPU's time in steps so far
};

class Engine {
 public:
  // Loads the model, sizes the KV pools and runs the preflight checks (worker/preflight.h):
  // InvalidArgument naming the setting and its limit for impossible settings. `hooks` are for
  // tests only.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(const EngineConfig& config,
                                                        const RunnerTestHooks& hooks = {});

  // InvalidArgument (engine unchanged) for an empty prompt, ids outside the vocabulary,
  // max_tokens < 1, prompt + max_tokens over max_model_len, bad sampling parameters;
  // AlreadyExists for a request id in flight.
  absl::Status AddRequest(RequestInput input);
  // Stops a request at any point and frees its blocks. NotFound for an unknown id.
  absl::Status Abort(const std::string& request_id);
  // Ends every request (finish reason abort) and frees its blocks; returns their ids.
  std::vector<std::string> AbortAll();

  // One step: the scheduler picks, the model runs the plan, then UpdateFromOutput(). Returns
  // the new tokens of every sample that has some, and the finished ones. With async scheduling
  // (async_scheduling()) the step is queued and the one before it applied: its outputs are
  // that step's, and the step after an idle engine's first says nothing. An error means the
  // model runner failed; the engine cannot step again.
  absl::StatusOr<std::vector<SequenceOutput>> Step();
  // Step() into `outs`, which it overwrites: its elements, with their strings' and lists'
  // memory, are reused, so that a caller keeping one vector across steps (the worker's loop)
  // allocates nothing per sequence at steady state. On error `outs` holds nothing of the step.
  absl::Status StepInto(std::vector<SequenceOutput>& outs);
  [[nodiscard]] bool HasWork() const {
    KVSERVE_CHECK_THREAD(engine_thread_);
    return !requests_.empty() || in_flight_.has_value();
  }
  // Whether steps run ahead (async scheduling, EngineConfig::async_scheduling): a step's
  // outputs then come from the step before it, the first step after an idle spell saying
  // nothing, and HasWork stays true until the last step was applied.
  [[nodiscard]] bool async_scheduling() const { return async_; }
  // Loads what structured outputs need (the vocabulary trie) now rather than on the first
  // constrained request; an error says they are unavailable (no usable tokenizer).
  absl::Status PreloadConstraints() {
    KVSERVE_CHECK_THREAD(engine_thread_);
    return constraints_->LoadVocabulary();
  }
  // Whether a request has been scheduled at least once (queue-time metrics). Unknown or
  // finished ids count as started.
  [[nodiscard]] bool Started(const std::string& request_id) const;
  // Hands the engine to another thread: the next call binds it (common/thread_checker.h).
  // Any thread, while no call of the engine is in progress.
  void HandOver() { engine_thread_.Detach(); }

  // Every change to the set of cached blocks from now on goes to `listener` (null: none), which
  // must outlive the engine or the next call; with `contents`, each with the block's content
  // (before any block is cached: KvCacheManager::set_event_listener).
  void SetKvEventListener(KvEventListener* listener, bool contents = false) {
    KVSERVE_CHECK_THREAD(engine_thread_);
    kv_->set_event_listener(listener, contents);
  }
  // Every (block hash, medium) now in the prefix cache, for KV-event snapshots.
  void ForEachCachedBlock(const std::function<void(const BlockHash&, Medium)>& fn) const;

  // KV transfer (docs/DISAGGREGATION.md; the PrefixTransfer part, worker/prefix_transfer.h). A
  // chunk of the device-cached blocks of `prompt` (with `cache_salt`), hashed as this engine hashes
  // them: from block `first_block` up to the first one not cached, at most `max_blocks`. One wire
  // (kv_block_wire.h) per tensor-parallel rank, each with that rank's KV heads; no blocks when
  // block `first_block` is not cached. FailedPrecondition on a device with no KV pools (null,
  // sim) or with prefix caching off.
  using PrefixChunk = worker::PrefixChunk;  // worker/prefix_transfer.h
  absl::StatusOr<PrefixChunk> ExportPrefix(absl::Span<const int32_t> prompt,
                                           const std::string& cache_salt, int first_block = 0,
                                           int max_blocks = std::numeric_limits<int>::max());
  // The same run as chunks of at most `blocks_per_chunk` blocks, each handed to `each` as soon as
  // encoded (the prompt is hashed once); `each` returns false to stop. At least one chunk is
  // handed over, empty when block `first_block` is not cached.
  absl::Status ExportPrefixChunks(absl::Span<const int32_t> prompt, const std::string& cache_salt,
                                  int first_block, int blocks_per_chunk,
                                  const std::function<bool(PrefixChunk)>& each);
  // Caches `wires` (one per rank, as a peer's ExportPrefix gave them) in the device pool as
  // `prompt`'s blocks from `first_block` on. Each block must be the prompt's block at its place
  // (its hash as hashed here), and block first_block - 1 must be cached here; blocks already
  // cached are skipped. Every wire is checked before anything is written; a request sent
  // afterwards finds them as prefix hits. Returns the blocks added. ResourceExhausted when the
  // pool cannot take them (nothing changes).
  absl::StatusOr<int> ImportPrefix(absl::Span<const int32_t> prompt, const std::string& cache_salt,
                                   absl::Span<const std::string> wires, int first_block = 0);
  // The device-to-device path (CUDA, NCCL links: `links` holds one per tensor-parallel rank,
  // rank r's to the peer's rank r).
  // StagePrefixForLink gathers the chunk ExportPrefix would give into each rank's device staging
  // pool; its wires are the ranks' link headers (kv_block_wire.h), which go to the peer by the
  // router. StartSendStagedPrefix then starts moving each rank's blocks over its link
  // (kernels::PollSends says when they are gone; nothing may be staged before;
  // SendStagedPrefix waits for it), while the peer's ReceivePrefixFromLink takes them: it
  // checks the headers as ImportPrefix checks wires (before a link is used), receives on every
  // link, checks the fingerprints (DataLoss, the links still in step) and caches the blocks as
  // ImportPrefix does. An error of a link itself leaves it dead (kernels/peer_link.h).
  absl::StatusOr<PrefixChunk> StagePrefixForLink(absl::Span<const int32_t> prompt,
                                                 const std::string& cache_salt, int first_block,
                                                 int max_blocks);
  absl::Status StartSendStagedPrefix(absl::Span<const std::unique_ptr<kernels::PeerLink>> links);
  absl::Status SendStagedPrefix(absl::Span<const std::unique_ptr<kernels::PeerLink>> links);
  absl::StatusOr<int> ReceivePrefixFromLink(
      absl::Span<const std::unique_ptr<kernels::PeerLink>> links, absl::Span<const int32_t> prompt,
      const std::string& cache_salt, absl::Span<const std::string> headers, int first_block);
  // Layer streaming (the LayerStreamer part, docs/DISAGGREGATION.md; a device backend, one
  // link per rank, as above). While request `request_id` prefills here, each step that
  // completes full blocks of its prompt sends each layer's bytes of them over `links` as soon
  // as the step has queued that layer's KV writes, so the transfer runs while the later layers
  // compute. It sends the prompt's blocks from `first_block` on (the first step also sends
  // those cached before it). `on_step` is called on the engine thread twice for each such
  // step: before it runs, with the blocks (the receiver queues the same receives:
  // StartStreamedReceive), and after, with each rank's fingerprint of them; and once with
  // `last` when nothing more comes (the prompt's blocks all sent, or the request ended). The
  // blocks stay held until their sends are done (PollLayerStreams, also run by Step). The links
  // must outlive the stream. FailedPrecondition for a request not here.
  using StreamStep = worker::StreamStep;  // worker/layer_streamer.h
  absl::Status StreamPrefill(const std::string& request_id, int first_block,
                             absl::Span<const std::unique_ptr<kernels::PeerLink>> links,
                             std::function<void(const StreamStep&)> on_step);
  // True once no stream is left and every send is done (the held blocks released); an error
  // of a failed send (the stream is dropped, its blocks released).
  absl::StatusOr<bool> PollLayerStreams();
  // The receiving end: queues the receives of blocks [first_block, + num_blocks) of `prompt`
  // into fresh device blocks (neither cached nor visible) over `links`, in the order the
  // sender sends them (one StartStreamedReceive per `on_step` before its step).
  // FinishStreamedReceive takes the oldest one queued on these links once its bytes arrived
  // (nullopt while they have not), checks the sender's fingerprints (DataLoss) and the
  // chain, and caches the blocks; returns those added. On any error its blocks are released.
  absl::Status StartStreamedReceive(absl::Span<const std::unique_ptr<kernels::PeerLink>> links,
                                    absl::Span<const int32_t> prompt, const std::string& cache_salt,
                                    int first_block, int num_blocks);
  absl::StatusOr<std::optional<int>> FinishStreamedReceive(
      absl::Span<const std::unique_ptr<kernels::PeerLink>> links,
      absl::Span<const uint64_t> fingerprints);
  // Forgets the layer streams and the streamed receives on the links whose rank 0's is `link0`
  // (links about to be destroyed, which ends their ops in flight), releasing their blocks;
  // called before the links go. `link0` is only compared, never read.
  void DropLinkStreams(const kernels::PeerLink* link0);
  // Whether a layer stream still sends (PollLayerStreams has work; Step polls only with work).
  [[nodiscard]] bool HasLayerStreams() const {
    KVSERVE_CHECK_THREAD(engine_thread_);
    return streamer_->has_streams();
  }
  // For devices that keep no KV (sim, null; the routing simulator): how many blocks of `prompt`
  // from `first_block` on this engine caches, and caching `blocks` of them here as if their
  // bytes had arrived (the bookkeeping of ImportPrefix alone; FailedPrecondition on a device
  // with KV pools). Returns the blocks added.
  [[nodiscard]] int CachedRun(absl::Span<const int32_t> prompt, const std::string& cache_salt,
                              int first_block) const;
  // The same, given the prompt's block hashes (PromptHashes'), so that a caller asking each
  // step hashes the prompt once.
  [[nodiscard]] int CachedRun(absl::Span<const BlockHash> hashes, int first_block) const;
  absl::StatusOr<int> AdoptPrefix(absl::Span<const int32_t> prompt, const std::string& cache_salt,
                                  int first_block, int blocks);
  // The bytes one block takes on the wire, every rank's together (headers aside); 0 when this
  // engine serves no KV transfer (the refusals above).
  [[nodiscard]] int64_t KvWireBlockBytes();

  // The host time of steps by phase (worker/model/step_profile.h), summed from when it was turned
  // on (turning it on clears it). Off by default.
  void EnableStepProfile(bool on) {
    KVSERVE_CHECK_THREAD(engine_thread_);
    profiling_ = on;
    profile_ = {};
  }
  [[nodiscard]] const StepProfile& step_profile() const {
    KVSERVE_CHECK_THREAD(engine_thread_);
    return profile_;
  }

  [[nodiscard]] EngineStats stats() const;
  // stats().computed_tokens without the rest (the server reads it around every step).
  [[nodiscard]] int64_t computed_tokens() const;
  // stats().computed_prompt_tokens alone (the server's prefill rate).
  [[nodiscard]] int64_t computed_prompt_tokens() const;
  // Device token slots of referenced blocks and the tokens in them (shared blocks counted once).
  struct KvUsage {
    int64_t allocated_slots = 0;
    int64_t used_tokens = 0;
  };
  [[nodiscard]] KvUsage kv_usage() const;
  // What the requests in flight ask of this engine, as routers weigh it (WorkerStatus.load_report,
  // docs/ROUTING.md "Multi-replica routers"). Walks every request in flight.
  struct Load {
    // Prompt tokens still to prefill: a waiting request's prompt less the cached prefix the
    // router predicted (RequestInput::predicted_cached_tokens), a started one's less what it
    // computed or found cached.
    int64_t prefill_tokens = 0;
    int64_t decode_seqs = 0;      // sequences past their prompt
    int64_t reserved_blocks = 0;  // per request: the blocks of its prompt and max_tokens
    int requests = 0;
    int waiting = 0;  // sequences waiting or swapped out
  };
  [[nodiscard]] Load load() const;
  // The memory budget, as printed at start-up.
  [[nodiscard]] const std::string& preflight_report() const { return preflight_; }
  [[nodiscard]] const GraphRecording& graph_recording() const { return graph_recording_; }
  [[nodiscard]] const ModelConfig& model_config() const { return model_config_; }
  [[nodiscard]] const EngineConfig& config() const { return config_; }
  [[nodiscard]] const KvCacheSpec& kv_spec() const { return kv_spec_; }
  [[nodiscard]] int max_model_len() const { return max_model_len_; }
  [[nodiscard]] int num_blocks() const { return num_blocks_; }
  // The model runner: its ranks' weights, backends and KV pools (benchmarks and tests read them).
  [[nodiscard]] ModelRunner& runner() {
    KVSERVE_CHECK_THREAD(engine_thread_);
    return *runner_;
  }

  // Test hooks: not for serving.
  [[nodiscard]] absl::Status TEST_CheckInvariants() const;  // every live sequence's blocks
  bool TEST_ForcePreemption() {
    KVSERVE_CHECK_THREAD(engine_thread_);
    Settle();
    return scheduler_->PreemptOne();
  }
  [[nodiscard]] const KvCacheManager& TEST_kv_cache() const {
    KVSERVE_CHECK_THREAD(engine_thread_);
    return *kv_;
  }

 private:
  Engine() = default;
  // Steps of Create: read the model's config and plan what the runner builds (KV formats,
  // pools, its configuration, the EOS ids); build the runner (weights, pools, graphs); then the
  // KV cache manager and the scheduler over its pool.
  absl::Status Plan() ABSL_EXCLUSIVE_LOCKS_REQUIRED(engine_thread_);
  absl::Status StartRunner(const RunnerTestHooks& hooks)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(engine_thread_);
  void StartScheduler() ABSL_EXCLUSIVE_LOCKS_REQUIRED(engine_thread_);

  // The step contract (vLLM's scheduler interface): the scheduler picks the sequences and
  // BuildStepPlan builds the batch (RunStep); UpdateFromOutput() applies the model's output to
  // them and reports.
  // Gives the batch the masks it left to compute (sequences in a constraint state met for the
  // first time): rank 0 computes them once the forward pass is queued, so that a device runs
  // it meanwhile (sequences and constraints are the engine thread's, which waits for the step).
  void AttachMaskFill(StepPlan& plan) ABSL_EXCLUSIVE_LOCKS_REQUIRED(engine_thread_);
  // `advanced`: AdvanceInFlight already moved the sequences' computed tokens. Outputs go into
  // `outs` from `used` on (CollectOutputs).
  void UpdateFromOutput(const StepPlan& plan, const ForwardOutput& out, bool advanced,
                        std::vector<SequenceOutput>& outs, size_t& used)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(engine_thread_);
  // Parts of UpdateFromOutput: the tokens each row drew (the sequences that got one added to
  // `appended`), each such sequence's stop conditions, then the outputs and retirements.
  void ApplyRow(const RowUse& use, const ForwardOutput& out, std::vector<Sequence*>& appended)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(engine_thread_);
  void CheckStop(Sequence& seq) ABSL_EXCLUSIVE_LOCKS_REQUIRED(engine_thread_);
  // Step() without its profile: Schedule, run, UpdateFromOutput.
  absl::Status RunStep(std::vector<SequenceOutput>& outs, size_t& used)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(engine_thread_);
  // Async scheduling (engine_step.cc). A step may stay in flight when planning the next one
  // needs nothing of it on the host (CanRunAhead); AdvanceInFlight then moves its sequences on
  // as it will (computed tokens; a placeholder for each draw), ApplyInFlight applies it once
  // the next step is queued (or before anything needs it settled), and Settle does that outside
  // a step, keeping its outputs for the next one.
  [[nodiscard]] bool CanRunAhead(const StepPlan& plan) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(engine_thread_);
  void AdvanceInFlight(const StepPlan& plan) ABSL_EXCLUSIVE_LOCKS_REQUIRED(engine_thread_);
  void ApplyInFlight(std::vector<SequenceOutput>& outs, size_t& used)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(engine_thread_);
  void Settle() ABSL_EXCLUSIVE_LOCKS_REQUIRED(engine_thread_);
  // With the profile on, adds the time since the last mark to `phase`.
  void Mark(StepPhase phase) ABSL_EXCLUSIVE_LOCKS_REQUIRED(engine_thread_) {
    if (profiling_) step_times_[phase] += step_clock_.Lap();
  }
  void CollectOutputs(std::vector<SequenceOutput>& outs, size_t& used)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(engine_thread_);

  absl::Status Validate(const RequestInput& in) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(engine_thread_);
  // The logits adjustments' parameters: ranges, and ids inside the vocabulary.
  absl::Status ValidateAdjustments(const SamplingParams& s, int max_tokens) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(engine_thread_);
  void UpdateHashes(Sequence& seq) ABSL_EXCLUSIVE_LOCKS_REQUIRED(engine_thread_);
  // The block-hash extra key of a request with `cache_salt` (common/kv/BLOCK_HASH.md).
  absl::StatusOr<std::string> ExtraKey(const std::string& cache_salt) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(engine_thread_);
  // The hashes of `prompt`'s full blocks, as a request with `cache_salt` gets them.
  absl::StatusOr<std::vector<BlockHash>> PromptHashes(absl::Span<const int32_t> prompt,
                                                      const std::string& cache_salt) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(engine_thread_);
  // `logprobs`: the token's, when the request wants them (else null). CheckStop then decides
  // whether it ended the sequence.
  void AppendToken(Sequence& seq, int32_t token, const TokenLogprobs* logprobs)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(engine_thread_);
  // Moves the sequence's constraint past `token`; whether the constraint is then complete (or
  // broken): the sequence ends.
  bool AdvanceConstraint(Sequence& seq, int32_t token)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(engine_thread_);
  // Jump-forward decoding (EngineConfig::jump_forward): a constrained sequence that goes on gets
  // the tokens its grammar forces next (Constraints::ForcedTokens) appended as generated, each
  // checked as a drawn one (stop ids, max_tokens); the next step computes them with its draw.
  // Not for a request that asks for logprobs: a jumped token has none (it was not drawn).
  void JumpForward(Sequence& seq) ABSL_EXCLUSIVE_LOCKS_REQUIRED(engine_thread_);
  // Makes the request's n - 1 further samples and appends the first token to each;
  // tokens[i] is sample i's (drawn with seed rng_seed + i), logprobs[i] its logprobs (or null).
  void Fork(Request& req, absl::Span<const int32_t> tokens, const TokenLogprobs* logprobs,
            std::vector<Sequence*>& appended) ABSL_EXCLUSIVE_LOCKS_REQUIRED(engine_thread_);

  // Constant after Create.
  EngineConfig config_;
  ModelConfig model_config_;
  KvCacheSpec kv_spec_;
  RunnerConfig runner_config_;
  PoolPlan pools_;
  std::vector<int> eos_ids_;
  int max_model_len_ = 0;
  int num_blocks_ = 0;
  std::string preflight_;
  GraphRecording graph_recording_;

  // Owned by the engine thread: the first thread that calls the engine after Create (Create
  // hands it over), checked by every method (common/thread_checker.h).
  ThreadChecker engine_thread_{"engine"};
  std::unique_ptr<ModelRunner> runner_ ABSL_GUARDED_BY(engine_thread_);
  std::unique_ptr<KvCacheManager> kv_ ABSL_GUARDED_BY(engine_thread_);
  // The KV transfer's part, on runner_ and kv_ (so declared after them: freed first).
  std::unique_ptr<PrefixTransfer> transfer_ ABSL_GUARDED_BY(engine_thread_);
  std::unique_ptr<Scheduler> scheduler_ ABSL_GUARDED_BY(engine_thread_);
  std::unique_ptr<Constraints> constraints_ ABSL_GUARDED_BY(engine_thread_);
  absl::flat_hash_map<std::string, std::unique_ptr<Request>> requests_
      ABSL_GUARDED_BY(engine_thread_);
  int64_t next_arrival_ ABSL_GUARDED_BY(engine_thread_) = 0;
  // Requests' seeds under --seed (EngineConfig::seed).
  std::mt19937_64 seeds_ ABSL_GUARDED_BY(engine_thread_);
  int64_t next_seq_id_ ABSL_GUARDED_BY(engine_thread_) = 0;
  EngineStats counters_ ABSL_GUARDED_BY(engine_thread_);
  // The step profile (EnableStepProfile): the phases of the step in progress, then the sums.
  bool profiling_ ABSL_GUARDED_BY(engine_thread_) = false;
  PhaseClock step_clock_ ABSL_GUARDED_BY(engine_thread_);
  PhaseSeconds step_times_ ABSL_GUARDED_BY(engine_thread_);
  StepProfile profile_ ABSL_GUARDED_BY(engine_thread_);
  // The sequences that got a token in the step being applied (reused between steps).
  std::vector<Sequence*> appended_ ABSL_GUARDED_BY(engine_thread_);
  // Async scheduling: on (constant after Create); the step queued whose results are not applied
  // yet; the requests that ended while it ran (its plan names them until it is applied); the
  // outputs of a step applied outside Step, which the next Step returns first.
  bool async_ = false;
  struct InFlight {
    StepPlan plan;
    ForwardOutput out;
  };
  std::optional<InFlight> in_flight_ ABSL_GUARDED_BY(engine_thread_);
  std::vector<std::unique_ptr<Request>> retiring_ ABSL_GUARDED_BY(engine_thread_);
  std::vector<SequenceOutput> settled_ ABSL_GUARDED_BY(engine_thread_);
  // The layer streaming part, on transfer_ (so declared after it: freed first).
  std::unique_ptr<LayerStreamer> streamer_ ABSL_GUARDED_BY(engine_thread_);
};

}  // namespace kvserve::worker

#endif  // KVSERVE_WORKER_ENGINE_H_
