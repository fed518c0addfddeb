// A generation request and its sequences (one per parallel sample), as the engine thread
// tracks them. Plain data: the scheduler, the KV cache manager and the sampler read and
// update these.
#ifndef KVSERVE_WORKER_REQUEST_H_
#define KVSERVE_WORKER_REQUEST_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/block_hash.h"

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
  // Return the logits at every prompt position (for --dump-logits and parity tests).
  bool return_prompt_logits = false;
};

struct Request;

enum class SeqStatus { kWaiting, kRunning, kSwapped, kFinished };

struct TokenLogprobs {
  int32_t token = 0;
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top;  // best first
};

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

  [[nodiscard]] int num_tokens() const { return static_cast<int>(tokens.size()); }
  [[nodiscard]] int num_output_tokens() const { return num_tokens() - num_prompt_tokens; }
  [[nodiscard]] bool prefill_done() const { return num_computed_tokens >= num_prompt_tokens; }
};

struct Request {
  RequestInput input;
  std::string extra_key;  // block-hash extra key (common/BLOCK_HASH.md) incl. the cache salt
  int64_t arrival = 0;    // admission order, for FCFS among equal priorities
  std::vector<std::unique_ptr<Sequence>> sequences;  // 1 until the prompt is done, then n
  bool forked = false;
  int num_cached_prompt_tokens = -1;  // prefix-cache hit at first admission
  std::vector<float> prompt_logits;   // [num_prompt_tokens, vocab] when requested
  int prompt_logits_rows = 0;
};

}  // namespace kvserve::worker

#endif  // KVSERVE_WORKER_REQUEST_H_
