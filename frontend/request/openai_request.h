// Parsing and validation of OpenAI-style request bodies for /v1/completions and
// /v1/chat/completions, into the front end's request description. Unknown fields are ignored;
// a bad field gives an OpenAiError naming it (HTTP 400, OpenAI's error shape), and so does a
// known parameter kvserve does not serve (best_of != n, beam search, the legacy `functions`,
// structural tags; echo and prompt_logprobs on chat) when it asks for anything. The body is
// untrusted: malformed JSON, invalid UTF-8 and wrong types are errors, never crashes.
//
//   absl::StatusOr<ParsedRequest> r = ParseCompletionRequest(body, /*chat=*/false);
//   if (!r.ok()) reply OpenAiErrorFromStatus(r.status()) as JSON;
#ifndef KVSERVE_FRONTEND_REQUEST_OPENAI_REQUEST_H_
#define KVSERVE_FRONTEND_REQUEST_OPENAI_REQUEST_H_

#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"
#include "frontend/request/parsed_request.h"

namespace kvserve::frontend {

// The parsed request, or InvalidArgument whose message is "param: what is wrong" (see
// frontend/output/openai_error.h for how the HTTP layer reports it).
absl::StatusOr<ParsedRequest> ParseCompletionRequest(std::string_view body, bool chat,
                                                     const RequestLimits& limits = {});

// The logprobs `r` asks for against the server's limits, once its prompts are tokenized
// (`prompt_tokens` over all of them; `vocab`, the tokenizer's size, is what -1, the whole
// vocabulary, counts as). InvalidArgument naming the field ("top_logprobs", "logprobs",
// "prompt_logprobs") whose alternatives are over limits.max_logprobs; naming "logprobs" when
// prompts × n × max_tokens × (1 + alternatives) of a request with logprobs is over
// limits.max_logprob_entries, or "prompt_logprobs" (or "echo") when prompt tokens × n ×
// (1 + alternatives) of one returning its prompts' logprobs is; OK otherwise.
absl::Status CheckLogprobBudget(const ParsedRequest& r, int64_t max_tokens,
                                const RequestLimits& limits, int64_t prompt_tokens, int64_t vocab);

}  // namespace kvserve::frontend

#endif  // KVSERVE_FRONTEND_REQUEST_OPENAI_REQUEST_H_
