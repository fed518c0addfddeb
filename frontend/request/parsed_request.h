// A request as the front end describes it once parsed (ParsedRequest), whichever API it came
// by: chat and completions (frontend/request/openai_request.h), the Responses and Messages APIs
// (responses_request.h, messages_request.h); and the caps one request must stay within
// (RequestLimits). Plain data.
#ifndef KVSERVE_FRONTEND_REQUEST_PARSED_REQUEST_H_
#define KVSERVE_FRONTEND_REQUEST_PARSED_REQUEST_H_

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/structured/constraint.h"
#include "common/tokenizer/chat_template.h"
#include "frontend/output/tool_calls.h"
#include "kvserve/v1/kvserve.pb.h"

namespace kvserve::frontend {

// Caps on what one request may ask for, so that no single request can take gigabytes or stall
// a handler thread; each is a router flag, and a request past one gets a 400 naming the parameter
// and the limit. Generous for real clients (OpenAI itself allows 4 stop sequences).
struct RequestLimits {
  int max_stop_strings = 64;           // --max-stop-strings
  int max_stop_string_bytes = 1024;    // --max-stop-string-bytes, each
  int max_stop_token_ids = 1024;       // --max-stop-token-ids
  int max_messages = 4096;             // --max-messages
  int64_t max_prompt_bytes = 1 << 20;  // --max-prompt-bytes: text before tokenization, in all
  int64_t max_prompt_ids = 1 << 20;    // token ids of a token-id prompt (the context length)
  int max_prompts = 1024;              // --max-prompts: prompts in one completions request
  // --max-logprobs: the most alternatives a position reports (vLLM's max_logprobs and its
  // default; -1: no cap, so top_logprobs -1 returns the whole vocabulary).
  int max_logprobs = 20;
  // --max-logprob-entries: n × max_tokens × (1 + top alternatives) for a request with logprobs,
  // what the router keeps per token and choice (about 300 bytes each).
  int64_t max_logprob_entries = 1 << 20;
  // --max-token-list-ids: entries of logit_bias, ids of allowed_token_ids (and bad_words count
  // against the stop-string limits).
  int max_token_list_ids = 1 << 17;
  // A constraint's size (structured outputs): a regex's bytes, and a choice list's strings.
  int max_constraint_bytes = 1 << 16;
  int max_choices = 1024;
  int max_tools = 128;  // OpenAI's limit
  // Not a limit but the parser's one server default: JSON constraints (structured outputs and
  // forced tool calls) allow any whitespace between tokens instead of compact JSON
  // (--structured-outputs-any-whitespace; a request's structured_outputs.disable_any_whitespace
  // overrides it).
  bool json_any_whitespace = false;
  // The default of return_tokens_as_token_ids (--return-tokens-as-token-ids, vLLM's flag).
  bool tokens_as_token_ids = false;
};

// A completions prompt: text, or token ids.
struct PromptInput {
  std::optional<std::string> text;
  std::vector<int32_t> ids;
};

struct ParsedRequest {
  bool chat = false;
  std::string model;
  // Completions: one prompt or several (a list), each answered by n choices. Chat: messages.
  std::vector<PromptInput> prompts;
  std::vector<tokenizer::ChatMessage> messages;
  bool add_generation_prompt = true;
  // Chat: the final message left open for the model to continue (vLLM's; needs
  // add_generation_prompt false).
  bool continue_final_message = false;
  // Logprobs name tokens "token_id:ID" instead of their text (vLLM's).
  bool return_tokens_as_token_ids = false;
  // vLLM's return_token_ids: the prompt's and each choice's token ids in the answer
  // (prompt_token_ids, token_ids; streamed: the prompt's in the first chunk, each chunk's ids).
  bool return_token_ids = false;
  // vLLM's request_id: the response's id is "chatcmpl-" / "cmpl-" and this (empty: the router's
  // own). The worker jobs keep the router's ids, so two requests may give the same one.
  std::string request_id;
  bool add_special_tokens = true;  // text prompts: BOS and the like, as vLLM's extra parameter
  std::optional<bool> enable_thinking;

  int max_tokens = 16;  // completions default (OpenAI); chat: until the model's limit
  bool max_tokens_given = false;
  // What the worker samples with, as the wire carries it (kvserve.v1.SamplingParams, its one
  // definition): temperature, top_p, top_k, min_p, seed, n, logprobs (top alternatives per
  // token: completions' logprobs, chat's top_logprobs), ignore_eos, the penalties, min_tokens,
  // logit_bias, allowed_token_ids, and bad_words as token ids (ResolveTokenParameters,
  // frontend/request/prompt.h, checks the ids against the vocabulary and tokenizes bad_words). The
  // parser sets every field (the API's defaults are in its calls); prompt_logprobs and the
  // constraint are set when the job is made (worker_prompt_logprobs, constraint below).
  kvserve::v1::SamplingParams sampling;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  bool stream = false;
  bool include_usage = false;
  // stream_options.continuous_usage_stats (vLLM's): every chunk carries its choice's usage so far.
  bool continuous_usage = false;
  std::string user;
  std::string cache_salt;
  std::optional<int> truncate_prompt_tokens;
  // vLLM's truncation_side: which end truncate_prompt_tokens cuts. "left" (the default) keeps
  // the last tokens, "right" the first.
  bool truncate_right = false;
  bool skip_special_tokens = true;          // in the returned text (vLLM's extra parameter)
  bool include_stop_str_in_output = false;  // vLLM's: the matched stop string ends the text
  std::vector<std::string> bad_words;       // as sent; sampling.bad_words once tokenized
  int priority = 0;  // vLLM's: lower runs first on a worker with --scheduling-policy priority
  // Completions: each choice's text (and logprobs) starts with its prompt's; max_tokens may be 0.
  // Chat (vLLM's): each choice's content starts with the last message's when that message has
  // the answer's role (assistant; without a generation prompt, the last message's own).
  bool echo = false;
  // vLLM's per-prompt-token logprobs with this many alternatives (not streamed): per choice on
  // completions, once at the top on chat.
  std::optional<int> prompt_logprobs;
  // Structured outputs (guided_regex, guided_choice, structured_outputs.regex / .choice), checked
  // by compiling it.
  // tool_choice "required" or a named function sets it too (frontend/output/tool_calls.h).
  std::optional<structured::ConstraintSpec> constraint;
  // Chat: tools, tool_choice, parallel_tool_calls.
  ToolRequest tool_use;

  // Samples per prompt, and the top alternatives per token (unset: no logprobs).
  [[nodiscard]] int n() const { return std::max(1, sampling.n()); }  // the wire's: 0 reads as 1
  [[nodiscard]] std::optional<int> logprobs() const {
    return sampling.has_logprobs() ? std::optional<int>(sampling.logprobs()) : std::nullopt;
  }
  // The alternatives each generated token reports with logprobs on: logprob_token_ids, when
  // given, in place of the top ones; kAllAlternatives for top_logprobs -1 (every one the worker
  // sends: its whole vocabulary).
  static constexpr int kAllAlternatives = INT32_MAX;
  [[nodiscard]] int alternatives() const {
    if (sampling.logprob_token_ids_size() > 0) return sampling.logprob_token_ids_size();
    const int top = logprobs().value_or(0);
    return top == -1 ? kAllAlternatives : top;
  }

  // The alternatives the worker scores per prompt token (-1: the whole vocabulary):
  // prompt_logprobs, or with completions' echo the logprobs' (vLLM's rule); unset when the
  // prompt's logprobs are not returned.
  [[nodiscard]] std::optional<int> worker_prompt_logprobs() const {
    if (echo && !chat && logprobs()) {
      if (prompt_logprobs == -1) return -1;
      return std::max(*logprobs(), prompt_logprobs.value_or(0));
    }
    return prompt_logprobs;
  }
};

}  // namespace kvserve::frontend

#endif  // KVSERVE_FRONTEND_REQUEST_PARSED_REQUEST_H_
