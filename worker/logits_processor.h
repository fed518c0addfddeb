// From a sequence's sampling parameters and tokens to the adjustments of its next draw's
// logits row (kernels/logits_processing.h): allowed ids, a constraint's allowed-token mask
// (Sequence::allowed_mask), logit_bias, bans (bad words, and EOS
// and the stop ids until min_tokens) and the token counts of the penalties, kept per sequence
// and brought up to date incrementally (Sequence::counts).
//
//   AddLogitsAdjustment(seq, logit_row, eos_ids, batch);  // nothing when the request has none
//
// Used on the engine thread while a step is planned.
#ifndef KVSERVE_WORKER_LOGITS_PROCESSOR_H_
#define KVSERVE_WORKER_LOGITS_PROCESSOR_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "worker/model/model.h"
#include "worker/request/request.h"

namespace kvserve::worker {

// Appends to `batch` the adjustments of `seq`'s draw from `logit_row`, when its request has any.
// `eos_ids`: the model's, banned with the request's stop ids before min_tokens (unless the
// request ignores EOS).
void AddLogitsAdjustment(Sequence& seq, int32_t logit_row, absl::Span<const int32_t> eos_ids,
                         ForwardBatch& batch);

// The ids bad words ban for the next token of a sequence whose generated tokens are `output`:
// each word's last id when the output ends with the word's other ids (vLLM's rule). Ascending,
// distinct.
std::vector<int32_t> BannedByBadWords(const std::vector<std::vector<int32_t>>& bad_words,
                                      absl::Span<const int32_t> output);

}  // namespace kvserve::worker

#endif  // KVSERVE_WORKER_LOGITS_PROCESSOR_H_
