// A request's prompt as token ids: a chat rendered with the tokenizer's chat template, a text
// prompt encoded, or given ids checked against the vocabulary; optionally NFC-normalized first
// (--normalize-prompts) and truncated to its last truncate_prompt_tokens (its first with
// truncation_side "right"); and the ids and
// words of the logits adjustments.
//
//   ASSIGN_OR_RETURN(std::vector<int> ids, PromptIds(tokenizer, request, normalize));
//
// Pure function of its inputs; any thread.
#ifndef KVSERVE_FRONTEND_REQUEST_PROMPT_H_
#define KVSERVE_FRONTEND_REQUEST_PROMPT_H_

#include <vector>

#include "absl/status/statusor.h"
#include "common/tokenizer/tokenizer.h"
#include "frontend/request/parsed_request.h"

namespace kvserve::frontend {

// The ids of completions prompt `index` (chat: the messages); InvalidArgument naming the field
// for a template that fails, an id outside the vocabulary or an empty prompt.
absl::StatusOr<std::vector<int>> PromptIds(const tokenizer::Tokenizer& tokenizer,
                                           const ParsedRequest& r, bool normalize,
                                           size_t index = 0);

// Checks the ids of logit_bias and allowed_token_ids against the vocabulary and tokenizes the
// bad words into r->sampling.bad_words as vLLM does (each word as it stands, and after a space when
// that gives a different first token and as many tokens). InvalidArgument naming the field.
absl::Status ResolveTokenParameters(const tokenizer::Tokenizer& tokenizer, ParsedRequest* r);

}  // namespace kvserve::frontend

#endif  // KVSERVE_FRONTEND_REQUEST_PROMPT_H_
