// One engine step as planned (the shape of vLLM's SchedulerOutput): the sequences the scheduler
// chose, the block copies to run first, the forward batch, and which sequence each logits row
// and each draw belongs to, so that the model's output can be applied afterwards.
//
//   StepPlan plan = BuildStepPlan(scheduler->Schedule(), kv->TakeCopies(), block_size);
//   ASSIGN_OR_RETURN(ForwardOutput out, runner->Execute(plan.copies, plan.batch));
//   ... plan.rows[i] says whose logits row i is and which draws of `out` are its ...
//
// Plain data; built and read on the engine thread.
#ifndef KVSERVE_WORKER_STEP_PLAN_H_
#define KVSERVE_WORKER_STEP_PLAN_H_

#include <vector>

#include "absl/types/span.h"
#include "worker/kv_cache/kv_cache_manager.h"
#include "worker/model/model.h"
#include "worker/request/request.h"
#include "worker/scheduler/scheduler.h"

namespace kvserve::worker {

// A logits row of the batch and what it is for.
struct RowUse {
  Sequence* seq = nullptr;
  int position = 0;          // the token position whose logits the row holds
  int host_row = -1;         // its index in the output's logits (prompt logits), or -1
  int first_sample = 0;      // its draws: the output's tokens [first_sample, + num_samples)
  int num_samples = 0;       // 0: a prompt row that draws nothing
  int first_logprobs = -1;   // the draws' logprobs from here in the output's, when asked for
  int prompt_logprobs = -1;  // the logprobs of prompt token position + 1 in the output's, or -1
  int given_logprobs = -1;   // SamplingParams::logprob_token_ids' scores from here, or -1
};

struct StepPlan {
  std::vector<Scheduler::ScheduledSeq> scheduled;
  BlockCopies copies;
  ForwardBatch batch;
  std::vector<RowUse> rows;
};

// The batch of the scheduled sequences' new tokens: positions, KV slots, block tables; a logits
// row for each sequence's last token (drawing n samples for a request's first token, 1 after,
// with its logits adjustments: worker/logits_processor.h, given the model's `eos_ids`) and for
// every prompt position of a request that returns its prompt logits or prompt logprobs (the
// latter scoring the next prompt token on the backend). A sequence whose last token is still
// being drawn by the step in flight (kPendingToken) gets a pending row: the device fills it in.
StepPlan BuildStepPlan(std::vector<Scheduler::ScheduledSeq> scheduled, BlockCopies copies,
                       int block_size, absl::Span<const int32_t> eos_ids);

}  // namespace kvserve::worker

#endif  // KVSERVE_WORKER_STEP_PLAN_H_
