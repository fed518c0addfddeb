// Parsing and validation of OpenAI-style request bodies for /v1/completions and
// /v1/chat/completions, into the router's request description. Unknown fields are ignored;
// a bad field gives an OpenAiError naming it (HTTP 400, OpenAI's error shape), and so does a
// known parameter kvserve does not serve (penalties, logit_bias, echo, best_of > n, guided
// decoding, response_format other than text, tools) when it asks for anything. The body is
// untrusted: malformed JSON, invalid UTF-8 and wrong types are errors, never crashes.
//
//   absl::StatusOr<ParsedRequest> r = ParseCompletionRequest(body, /*chat=*/false);
//   if (!r.ok()) reply OpenAiErrorFromStatus(r.status()) as JSON;
#ifndef KVSERVE_ROUTER_OPENAI_REQUEST_H_
#define KVSERVE_ROUTER_OPENAI_REQUEST_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tokenizer/chat_template.h"

namespace kvserve::router {

struct ParsedRequest {
  bool chat = false;
  std::string model;
  // Completions: a text prompt or token ids. Chat: messages.
  std::optional<std::string> prompt_text;
  std::vector<int32_t> prompt_ids;
  std::vector<tokenizer::ChatMessage> messages;
  bool add_generation_prompt = true;
  bool add_special_tokens = true;  // text prompts: BOS and the like, as vLLM's extra parameter
  std::optional<bool> enable_thinking;

  int max_tokens = 16;  // completions default (OpenAI); chat: until the model's limit
  bool max_tokens_given = false;
  float temperature = 1.0f;
  float top_p = 1.0f;
  int top_k = -1;
  float min_p = 0.0f;
  std::optional<uint64_t> seed;
  int n = 1;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  std::optional<int>
      logprobs;  // top alternatives per token (completions: logprobs; chat: top_logprobs)
  bool stream = false;
  bool include_usage = false;
  bool ignore_eos = false;
  std::string user;
  std::string cache_salt;
  std::optional<int> truncate_prompt_tokens;
  bool skip_special_tokens = true;          // in the returned text (vLLM's extra parameter)
  bool include_stop_str_in_output = false;  // vLLM's: the matched stop string ends the text
};

// The parsed request, or InvalidArgument whose message is "param: what is wrong" (see
// router/openai_error.h for how the HTTP layer reports it).
absl::StatusOr<ParsedRequest> ParseCompletionRequest(std::string_view body, bool chat);

}  // namespace kvserve::router

#endif  // KVSERVE_ROUTER_OPENAI_REQUEST_H_
