// A generation request and its sequences (one per parallel sample), as the engine thread
// tracks them. Plain data: the scheduler, the KV cache manager and the sampler read and
// update these.
#ifndef KVSERVE_WORKER_REQUEST_REQUEST_H_
#define KVSERVE_WORKER_REQUEST_REQUEST_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/kv/block_hash.h"
#include "common/structured/constraint.h"
#include "common/structured/grammar.h"
#include "kernels/logits_processing.h"

namespace kvserve::structured {
struct TokenMask;
}  // namespace kvserve::structured

namespace kvserve::worker {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy
  float top_p = 1.0f;        // (0, 1]
  int top_k = 0;             // 0 or -1: off
  float min_p = 0.0f;        // [0, 1]
  std::optional<uint64_t> seed;
  std::optional<int> logprobs;  // top-N alternatives to return (0: only the sampled token's)
  bool ignore_eos = false;
  int n = 1;  // parallel samples; sample i uses seed + i
  // The logits adjustments (kernels/logits_processing.h, worker/logits_processor.h).
  float presence_penalty = 0.0f;    // [-2, 2], over generated tokens
  float frequency_penalty = 0.0f;   // [-2, 2], over generated tokens
  float repetition_penalty = 1.0f;  // > 0, over prompt and generated tokens; 1: off
  int min_tokens = 0;               // EOS and stop ids neither drawn nor acted on before
  // Any order; Engine::AddRequest sorts them by id, keeping one entry per id (the last bias).
  std::vector<std::pair<int32_t, float>> logit_bias;
  std::vector<std::vector<int32_t>> bad_words;  // token sequences never generated
  std::vector<int32_t> allowed_token_ids;       // empty: every id
  // vLLM's: each prompt token's logprob (after the first) with this many alternatives.
  std::optional<int> prompt_logprobs;
  // vLLM's: with `logprobs`, these ids' logprobs at each draw in place of the top alternatives.
  std::vector<int32_t> logprob_token_ids;

  [[nodiscard]] bool penalized() const {
    return presence_penalty != 0.0f || frequency_penalty != 0.0f || repetition_penalty != 1.0f;
  }
  [[nodiscard]] bool adjusts_logits() const {
    return penalized() || min_tokens > 0 || !logit_bias.empty() || !bad_words.empty() ||
           !allowed_token_ids.empty();
  }
};

// A sequence's distinct tokens for the penalties, brought up to date before each draw.
struct TokenCounts {
  std::vector<kernels::TokenCount> entries;
  absl::flat_hash_map<int32_t, int32_t> index;  // id -> its entry
  int counted = 0;                              // leading tokens of Sequence::tokens counted
};

enum class FinishReason { kNone, kStop, kLength, kAbort };

struct RequestInput {
  std::string request_id;
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int max_tokens = 16;
  std::vector<int32_t> stop_token_ids;
  int priority = 0;  // lower runs first
  std::string cache_salt;
  // The prompt tokens the router predicted cached here (GenerateRequest.predicted_cached_tokens):
  // what Engine::load() counts off a waiting request's prefill. Never trusted for the cache.
  int predicted_cached_tokens = 0;
  // Return the logits at every prompt position (for --dump-logits and parity tests).
  bool return_prompt_logits = false;
  // Structured outputs: what the generated text must match (worker/constraints.h).
  std::optional<structured::ConstraintSpec> constraint;

  // Whether every prompt position's logits are computed (not read from the prefix cache).
  [[nodiscard]] bool needs_prompt_rows() const {
    return return_prompt_logits || sampling.prompt_logprobs.has_value();
  }
};

struct Request;
struct CompiledConstraint;

enum class SeqStatus { kWaiting, kRunning, kSwapped, kFinished };

struct TokenLogprobs {
  int32_t token = 0;
  float logprob = 0.0f;
  int32_t rank = 0;                            // kernels::LogprobRequest's
  std::vector<std::pair<int32_t, float>> top;  // best first
};

// A token the host does not know yet (Sequence::pending_sample).
inline constexpr int32_t kPendingToken = -1;

struct Sequence {
  int64_t id = 0;
  Request* request = nullptr;
  int sample_index = 0;
  std::vector<int32_t> tokens;  // prompt, then generated tokens
  int num_prompt_tokens = 0;
  int num_computed_tokens = 0;          // tokens whose KV is in the cache
  std::vector<BlockHash> block_hashes;  // of the full blocks of `tokens`
  std::vector<int> block_table;
  int num_cached_blocks = 0;  // leading blocks registered in (or taken from) the prefix cache
  SeqStatus status = SeqStatus::kWaiting;
  FinishReason finish_reason = FinishReason::kNone;
  std::optional<int32_t> stop_token;
  std::vector<TokenLogprobs> logprobs;
  int64_t rng_seed = 0;
  size_t num_emitted = 0;  // generated tokens already reported by Step()
  TokenCounts counts;      // kept only when the request's penalties need them
  // With a constraint: the automaton's state after the generated tokens, and what it allows.
  structured::GrammarMatcher::State constraint_state = 0;
  std::shared_ptr<const structured::TokenMask> allowed_mask;
  // The mask of constraint_state is not computed yet: the next step computes it while its
  // forward pass runs (the ForwardBatch's fill_masks, set by Engine::AttachMaskFill), and sets
  // allowed_mask.
  bool mask_pending = false;
  // Async scheduling (Engine): the last token is a placeholder (kPendingToken) for sample
  // `pending_sample` of the step in flight, known once that step is applied; -1: none. And
  // whether that token is the last it may take (max_tokens, the context): not scheduled again.
  int pending_sample = -1;
  bool ends_when_applied = false;

  [[nodiscard]] int num_tokens() const { return static_cast<int>(tokens.size()); }
  [[nodiscard]] int num_output_tokens() const { return num_tokens() - num_prompt_tokens; }
  [[nodiscard]] bool prefill_done() const { return num_computed_tokens >= num_prompt_tokens; }
};

struct Request {
  RequestInput input;
  std::string extra_key;  // block-hash extra key (common/kv/BLOCK_HASH.md) incl. the cache salt
  int64_t arrival = 0;    // admission order, for FCFS among equal priorities
  std::vector<std::unique_ptr<Sequence>> sequences;  // 1 until the prompt is done, then n
  bool forked = false;
  int num_cached_prompt_tokens = -1;               // prefix-cache hit at first admission
  std::shared_ptr<CompiledConstraint> constraint;  // compiled input.constraint
  std::vector<float> prompt_logits;                // [num_prompt_tokens, vocab] when requested
  // With sampling.prompt_logprobs: entry i for prompt token i + 1; sent with the first output.
  std::vector<TokenLogprobs> prompt_logprobs;
  bool prompt_logprobs_sent = false;
};

}  // namespace kvserve::worker

#endif  // KVSERVE_WORKER_REQUEST_REQUEST_H_
