// What kvserve's endpoint picker reads of an inference request to place it (epp/): the
// prompt's token ids as the pool's model servers will see them (the chat template and the
// tokenizer of the router's --model), the tokens it may generate, its samples and its cache
// salt, in a GenerateRequest the router's core books but never sends.
//
// Only the fields that decide these are read: they are copied into a body of their own and
// parsed by the router's own parser (frontend/request/openai_request.h), so that a parameter the
// pods serve and kvserve's router does not is never refused here (the pod answers for it), while a
// malformed prompt is refused with the error the router would give.
//
//   absl::StatusOr<PickRequest> r = ReadPickRequest(options, tokenizer, path, body);
//
// Pure function of its inputs; any thread.
#ifndef KVSERVE_EPP_PICK_REQUEST_H_
#define KVSERVE_EPP_PICK_REQUEST_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/tokenizer/tokenizer.h"
#include "frontend/request/openai_request.h"
#include "kvserve/v1/kvserve.pb.h"

namespace kvserve::epp {

struct PickOptions {
  int max_model_len = 4096;
  bool normalize_prompts = false;  // --normalize-prompts, as the HTTP front applies it
  frontend::RequestLimits limits;
};

struct PickRequest {
  kvserve::v1::GenerateRequest request;  // prompt_token_ids, max_tokens, sampling.n, cache_salt
  bool has_prompt = false;  // false: a path with no prompt kvserve reads (placed by load)
};

// `path` is the request's :path (a query string is ignored). /v1/completions and
// /v1/chat/completions are read; any other path, or a request with no body, is placed by load
// alone. InvalidArgument naming the field for a body those two paths cannot take.
absl::StatusOr<PickRequest> ReadPickRequest(const PickOptions& options,
                                            const tokenizer::Tokenizer& tokenizer,
                                            std::string_view path, std::string_view body);

}  // namespace kvserve::epp

#endif  // KVSERVE_EPP_PICK_REQUEST_H_
