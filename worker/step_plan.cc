#include "worker/step_plan.h"

#include <algorithm>

#include "worker/logits_processor.h"
#include "worker/sampler.h"

namespace kvserve::worker {
namespace {

// Adds the draws of `seq`'s last token to the batch: n for a request's first token (sample i
// seeded rng_seed + i), else one; and its row's logits adjustments.
void AddDraws(Sequence& seq, int32_t logit_row, absl::Span<const int32_t> eos_ids,
              ForwardBatch& batch, RowUse& use) {
  const Request& req = *seq.request;
  AddLogitsAdjustment(seq, logit_row, eos_ids, batch);
  const SamplingParams& sampling = req.input.sampling;
  const bool fork = !req.forked && sampling.n > 1;
  use.first_sample = static_cast<int>(batch.samples.size());
  use.num_samples = fork ? sampling.n : 1;
  const std::vector<int32_t>& given = sampling.logprob_token_ids;
  // Given ids replace the top alternatives; the draws then score only their own token.
  const int top_n = given.empty() ? sampling.logprobs.value_or(0) : 0;
  if (sampling.logprobs) use.first_logprobs = static_cast<int>(batch.logprobs.size());
  for (int i = 0; i < use.num_samples; ++i) {
    if (sampling.logprobs) {
      batch.logprobs.push_back({logit_row, static_cast<int32_t>(batch.samples.size()), top_n});
    }
    batch.samples.push_back(MakeSampleRequest(sampling, seq.rng_seed + i,
                                              fork ? 0 : seq.num_output_tokens(), logit_row));
  }
  if (sampling.logprobs && !given.empty()) {  // the row's, shared by its draws
    use.given_logprobs = static_cast<int>(batch.logprobs.size());
    for (int32_t id : given) batch.logprobs.push_back({logit_row, -1, 0, id});
  }
}

// Adds `seq`'s `n` new tokens (from num_computed_tokens on) and their logits rows.
void AddSequence(Sequence& seq, int n, int block_size, absl::Span<const int32_t> eos_ids,
                 StepPlan& plan) {
  ForwardBatch& batch = plan.batch;
  const int start = seq.num_computed_tokens;
  batch.query_start.push_back(static_cast<int32_t>(batch.token_ids.size()));
  batch.query_len.push_back(n);
  batch.context_len.push_back(start + n);
  const RequestInput& input = seq.request->input;
  const bool prompt_rows = input.needs_prompt_rows() && seq.sample_index == 0;
  for (int pos = start; pos < start + n; ++pos) {
    const int row = static_cast<int>(batch.token_ids.size());
    batch.token_ids.push_back(seq.tokens[pos]);
    if (seq.tokens[pos] == kPendingToken) {  // the step in flight draws it (async scheduling)
      batch.pending_rows.push_back(row);
      batch.pending_from.push_back(seq.pending_sample);
    }
    batch.positions.push_back(pos);
    batch.slot_mapping.push_back(int64_t{seq.block_table[pos / block_size]} * block_size +
                                 pos % block_size);
    const bool last = pos + 1 == seq.num_tokens();
    const bool prompt_row = prompt_rows && pos < seq.num_prompt_tokens;
    if (!last && !prompt_row) continue;
    RowUse use{&seq, pos};
    const auto logit_row = static_cast<int32_t>(batch.logit_rows.size());
    batch.logit_rows.push_back(row);
    if (prompt_row && input.return_prompt_logits) {
      use.host_row = static_cast<int>(batch.host_logit_rows.size());
      batch.host_logit_rows.push_back(logit_row);
    }
    if (prompt_row && input.sampling.prompt_logprobs && pos + 1 < seq.num_prompt_tokens) {
      use.prompt_logprobs = static_cast<int>(batch.logprobs.size());
      batch.logprobs.push_back(
          {logit_row, -1, *input.sampling.prompt_logprobs, seq.tokens[pos + 1]});
    }
    if (last) AddDraws(seq, logit_row, eos_ids, batch, use);
    plan.rows.push_back(use);
  }
  // The sequence's row of the block tables, sized (zeros past its blocks) by BuildStepPlan.
  const size_t row = batch.query_start.size() - 1;
  std::copy(seq.block_table.begin(), seq.block_table.end(),
            batch.block_tables.begin() + static_cast<ptrdiff_t>(row * batch.max_blocks_per_seq));
}

// Room for the batch's per-token and per-sequence lists, so that building it reallocates none
// (a step of 256 sequences at 8K tokens has block tables of 131K entries).
void ReserveBatch(const std::vector<Scheduler::ScheduledSeq>& scheduled, StepPlan& plan) {
  size_t tokens = 0;
  for (const auto& s : scheduled) tokens += static_cast<size_t>(s.num_new_tokens);
  const size_t seqs = scheduled.size();
  ForwardBatch& b = plan.batch;
  b.token_ids.reserve(tokens);
  b.positions.reserve(tokens);
  b.slot_mapping.reserve(tokens);
  b.query_start.reserve(seqs);
  b.query_len.reserve(seqs);
  b.context_len.reserve(seqs);
  b.logit_rows.reserve(seqs);
  b.samples.reserve(seqs);
  plan.rows.reserve(seqs);
  b.block_tables.assign(seqs * static_cast<size_t>(b.max_blocks_per_seq), 0);
}

}  // namespace

StepPlan BuildStepPlan(std::vector<Scheduler::ScheduledSeq> scheduled, BlockCopies copies,
                       int block_size, absl::Span<const int32_t> eos_ids) {
  StepPlan plan;
  plan.scheduled = std::move(scheduled);
  plan.copies = std::move(copies);
  int max_blocks = 1;
  for (const auto& s : plan.scheduled) {
    max_blocks = std::max<int>(max_blocks, static_cast<int>(s.seq->block_table.size()));
  }
  plan.batch.max_blocks_per_seq = max_blocks;
  ReserveBatch(plan.scheduled, plan);
  for (const auto& [seq, n] : plan.scheduled) AddSequence(*seq, n, block_size, eos_ids, plan);
  return plan;
}

}  // namespace kvserve::worker
