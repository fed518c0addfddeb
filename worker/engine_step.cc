// The engine's step (worker/engine.h): plan, run, apply; with async scheduling the next step
// is planned and queued while the device runs this one, and applied one step later. The
// engine thread runs all of it.
#include <algorithm>

#include "common/status_macros.h"
#include "glog/logging.h"
#include "kernels/sampling.h"
#include "worker/engine.h"

namespace kvserve::worker {

void Engine::AppendToken(Sequence& seq, int32_t token, const TokenLogprobs* logprobs) {
  KVSERVE_CHECK_THREAD(engine_thread_);
  if (seq.pending_sample >= 0) {  // the placeholder the step in flight was planned with
    seq.tokens.back() = token;
    seq.pending_sample = -1;
    seq.ends_when_applied = false;
  } else {
    seq.tokens.push_back(token);
  }
  ++counters_.generated_tokens;
  if (logprobs != nullptr) seq.logprobs.push_back(*logprobs);
  UpdateHashes(seq);
}

void Engine::CheckStop(Sequence& seq) {
  KVSERVE_CHECK_THREAD(engine_thread_);
  const RequestInput& in = seq.request->input;
  const int32_t token = seq.tokens.back();
  // Before min_tokens, EOS and the stop ids are banned from the draw and end nothing.
  const bool may_stop = seq.num_output_tokens() > in.sampling.min_tokens;
  if (may_stop && (std::find(in.stop_token_ids.begin(), in.stop_token_ids.end(), token) !=
                       in.stop_token_ids.end() ||
                   (!in.sampling.ignore_eos &&
                    std::find(eos_ids_.begin(), eos_ids_.end(), token) != eos_ids_.end()))) {
    seq.finish_reason = FinishReason::kStop;
    seq.stop_token = token;
  } else if (seq.request->constraint != nullptr && AdvanceConstraint(seq, token)) {
    seq.finish_reason = FinishReason::kStop;  // the constraint is complete: nothing may follow
  } else if (seq.num_output_tokens() >= in.max_tokens || seq.num_tokens() >= max_model_len_) {
    seq.finish_reason = FinishReason::kLength;
  }
}

void Engine::JumpForward(Sequence& seq) {
  KVSERVE_CHECK_THREAD(engine_thread_);
  const Request& req = *seq.request;
  if (seq.finish_reason != FinishReason::kNone || req.constraint == nullptr ||
      req.input.sampling.logprobs.has_value()) {
    return;
  }
  for (int32_t token : constraints_->ForcedTokens(*req.constraint, seq.constraint_state)) {
    AppendToken(seq, token, nullptr);
    ++counters_.jumped_tokens;
    CheckStop(seq);  // a stop id, max_tokens or the context end: as a drawn token would
    if (seq.finish_reason != FinishReason::kNone) break;
  }
}

bool Engine::AdvanceConstraint(Sequence& seq, int32_t token) {
  KVSERVE_CHECK_THREAD(engine_thread_);
  CompiledConstraint& c = *seq.request->constraint;
  seq.constraint_state = constraints_->Advance(c, seq.constraint_state, token);
  // Only a token the mask allowed is drawn, so the state stays alive; a dead one (a stop id
  // outside the language, once min_tokens is reached) ends the sequence too.
  if (seq.constraint_state == structured::GrammarMatcher::kDead) return true;
  seq.allowed_mask = constraints_->Cached(c, seq.constraint_state);
  seq.mask_pending = seq.allowed_mask == nullptr;  // computed during the next step
  return !c.matcher.has_next(seq.constraint_state);
}

void Engine::Fork(Request& req, absl::Span<const int32_t> tokens, const TokenLogprobs* logprobs,
                  std::vector<Sequence*>& appended) {
  KVSERVE_CHECK_THREAD(engine_thread_);
  Sequence& first = *req.sequences[0];
  for (int i = 1; i < req.input.sampling.n; ++i) {
    auto child = std::make_unique<Sequence>();
    child->id = next_seq_id_++;
    child->request = &req;
    child->sample_index = i;
    child->tokens = first.tokens;
    child->num_prompt_tokens = first.num_prompt_tokens;
    child->block_hashes = first.block_hashes;
    child->rng_seed = first.rng_seed + i;
    child->constraint_state = first.constraint_state;
    child->allowed_mask = first.allowed_mask;
    child->mask_pending = first.mask_pending;
    kv_->Fork(first, *child);
    scheduler_->AddRunning(child.get());
    req.sequences.push_back(std::move(child));
  }
  req.forked = true;
  for (size_t i = 0; i < req.sequences.size(); ++i) {
    AppendToken(*req.sequences[i], tokens[i], logprobs == nullptr ? nullptr : logprobs + i);
    appended.push_back(req.sequences[i].get());
  }
}

absl::StatusOr<std::vector<SequenceOutput>> Engine::Step() {
  KVSERVE_CHECK_THREAD(engine_thread_);
  std::vector<SequenceOutput> outs;
  RETURN_IF_ERROR(StepInto(outs));
  return outs;
}

absl::Status Engine::StepInto(std::vector<SequenceOutput>& outs) {
  KVSERVE_CHECK_THREAD(engine_thread_);
  // What a step applied outside Step (Settle) said comes first.
  size_t used = 0;
  for (SequenceOutput& o : settled_) {
    if (used == outs.size()) outs.emplace_back();
    outs[used++] = std::move(o);
  }
  settled_.clear();
  absl::Status status;
  if (!profiling_) {
    status = RunStep(outs, used);
  } else {
    const double cpu_start = ThreadCpuSeconds();
    PhaseClock wall;
    step_times_ = {};
    step_clock_.Lap();
    const int64_t steps_before = counters_.steps;
    status = RunStep(outs, used);
    const double wall_s = wall.Lap();
    if (counters_.steps > steps_before) {  // it applied a batch (UpdateFromOutput counts it)
      ++profile_.steps;
      for (size_t p = 0; p < profile_.seconds.s.size(); ++p) {
        profile_.seconds.s[p] += step_times_.s[p];
      }
      profile_.wall_seconds += wall_s;
      profile_.cpu_seconds += ThreadCpuSeconds() - cpu_start;
    }
  }
  outs.resize(status.ok() ? used : 0);
  return status;
}

absl::Status Engine::RunStep(std::vector<SequenceOutput>& outs, size_t& used) {
  KVSERVE_CHECK_THREAD(engine_thread_);
  if (streamer_->has_streams() || streamer_->has_receives()) {
    ApplyInFlight(outs, used);  // streams run with steps in series
    // A failed link ends its stream (the receiver fails its receive): never this step.
    if (absl::StatusOr<bool> s = PollLayerStreams(); !s.ok())
      LOG(WARNING) << "layer streaming: " << s.status();
  }
  Scheduler::Output chosen = scheduler_->Schedule(/*may_preempt=*/!in_flight_.has_value());
  if (chosen.blocked) {  // out of blocks with a step in flight: apply it, then preempt
    ApplyInFlight(outs, used);
    chosen = scheduler_->Schedule();
  }
  Mark(StepPhase::kSchedule);
  StepPlan plan = BuildStepPlan(std::move(chosen.scheduled), kv_->TakeCopies(),
                                config_.cache.block_size, eos_ids_);
  AttachMaskFill(plan);
  std::vector<LayerStreamer::Send> sends = streamer_->PlanSends(plan);
  counters_.cow_copies += static_cast<int64_t>(plan.copies.device_to_device.size());
  if (plan.scheduled.empty() && plan.copies.empty()) {
    ApplyInFlight(outs, used);
    return absl::OkStatus();
  }
  const bool ahead = async_ && sends.empty() && CanRunAhead(plan);
  plan.batch.async_results = ahead;
  plan.batch.time_phases = profiling_;
  Mark(StepPhase::kPlan);
  // With nothing scheduled, preemptions may still have planned swap-outs: the runner moves the
  // data and runs no batch.
  absl::StatusOr<ForwardOutput> out = runner_->Execute(plan.copies, plan.batch);
  kv_->FinishCopies();
  RETURN_IF_ERROR(out.status());
  if (!sends.empty()) streamer_->FinishSends(sends);
  Mark(StepPhase::kRunner);
  if (profiling_) {  // rank 0's model phases, out of the runner's time
    const ForwardTimes& t = out->times;
    step_times_[StepPhase::kInputs] += t.inputs;
    step_times_[StepPhase::kLaunch] += t.launch;
    step_times_[StepPhase::kDownload] += t.download;
    step_times_[StepPhase::kRunner] -= t.inputs + t.launch + t.download;
  }
  counters_.sim_busy_seconds += out->sim_seconds;
  // The step before, while this one runs on the device.
  ApplyInFlight(outs, used);
  if (plan.scheduled.empty()) return absl::OkStatus();
  if (ahead) {
    ++counters_.steps_ahead;
    AdvanceInFlight(plan);
    in_flight_.emplace(InFlight{std::move(plan), *std::move(out)});
    return absl::OkStatus();
  }
  UpdateFromOutput(plan, *out, /*advanced=*/false, outs, used);
  return absl::OkStatus();
}

bool Engine::CanRunAhead(const StepPlan& plan) const {
  KVSERVE_CHECK_THREAD(engine_thread_);
  // The next step is planned before this one's tokens are known: nothing it plans may depend on
  // them on the host (a constraint's mask, the penalties' counts, bad words' prefixes, the
  // forks of n samples), and nothing of this step may come back but its draws (no logits rows:
  // prompt logits, or logprobs wider than kMaxTopLogprobs).
  if (!plan.batch.host_logit_rows.empty() || plan.batch.fill_masks) return false;
  for (const RowUse& use : plan.rows) {
    if (use.num_samples > 1) return false;
  }
  for (const kernels::LogprobRequest& q : plan.batch.logprobs) {
    if (q.top_n > kernels::kMaxTopLogprobs) return false;
  }
  for (const Scheduler::ScheduledSeq& s : plan.scheduled) {
    const Request& req = *s.seq->request;
    const SamplingParams& sp = req.input.sampling;
    if (req.constraint != nullptr || sp.penalized() || !sp.bad_words.empty()) return false;
  }
  return true;
}

void Engine::AdvanceInFlight(const StepPlan& plan) {
  KVSERVE_CHECK_THREAD(engine_thread_);
  // As the step will leave them, but for the drawn tokens: placeholders until it is applied.
  for (const auto& [seq, n] : plan.scheduled) {
    if (seq->status == SeqStatus::kFinished) continue;  // ended by the step applied just now
    seq->num_computed_tokens += n;
  }
  for (const RowUse& use : plan.rows) {
    Sequence& seq = *use.seq;
    if (use.num_samples == 0 || seq.status == SeqStatus::kFinished) continue;
    seq.tokens.push_back(kPendingToken);
    seq.pending_sample = use.first_sample;
    seq.ends_when_applied = seq.num_output_tokens() >= seq.request->input.max_tokens ||
                            seq.num_tokens() >= max_model_len_;
  }
}

void Engine::ApplyInFlight(std::vector<SequenceOutput>& outs, size_t& used) {
  KVSERVE_CHECK_THREAD(engine_thread_);
  if (!in_flight_) return;
  InFlight f = std::move(*in_flight_);
  in_flight_.reset();
  Mark(StepPhase::kRunner);
  runner_->Collect(f.plan.batch, f.out);  // the wait for its tokens
  Mark(StepPhase::kDownload);
  UpdateFromOutput(f.plan, f.out, /*advanced=*/true, outs, used);
}

void Engine::Settle() {
  KVSERVE_CHECK_THREAD(engine_thread_);
  if (!in_flight_) return;
  size_t used = settled_.size();
  ApplyInFlight(settled_, used);
  settled_.resize(used);
}

void Engine::AttachMaskFill(StepPlan& plan) {
  KVSERVE_CHECK_THREAD(engine_thread_);
  struct Late {
    int32_t offset;  // in mask_words
    Sequence* seq;
  };
  std::vector<Late> late;
  for (const kernels::LogitsAdjustment& a : plan.batch.adjustments) {
    Sequence* seq = plan.rows[a.row].seq;
    if (a.mask_begin >= 0 && seq->mask_pending) late.push_back({a.mask_begin, seq});
  }
  if (late.empty()) return;
  plan.batch.fill_masks = [this, late = std::move(late)](std::vector<uint32_t>& words) {
    KVSERVE_CHECK_THREAD(engine_thread_);  // rank 0 runs it, on the engine thread
    for (const Late& l : late) {
      Sequence& seq = *l.seq;
      seq.allowed_mask = constraints_->Mask(*seq.request->constraint, seq.constraint_state);
      seq.mask_pending = false;
      std::copy(seq.allowed_mask->words.begin(), seq.allowed_mask->words.end(),
                words.begin() + l.offset);
    }
  };
}

void Engine::UpdateFromOutput(const StepPlan& plan, const ForwardOutput& out, bool advanced,
                              std::vector<SequenceOutput>& outs, size_t& used) {
  KVSERVE_CHECK_THREAD(engine_thread_);
  // Requests that ended while this step ran: the plan names them until here.
  std::vector<std::unique_ptr<Request>> retired = std::move(retiring_);
  retiring_.clear();
  ++counters_.steps;
  counters_.graph_steps += out.graph ? 1 : 0;
  for (const auto& [seq, n] : plan.scheduled) {
    if (seq->status == SeqStatus::kFinished) continue;  // ended while this step ran
    if (!advanced) seq->num_computed_tokens += n;
    const int start = seq->num_computed_tokens - n;
    counters_.computed_tokens += n;
    counters_.computed_prompt_tokens +=
        std::max(0, std::min(start + n, seq->num_prompt_tokens) - start);
    kv_->CacheComputedBlocks(*seq);
  }
  Mark(StepPhase::kCacheCommit);
  appended_.clear();
  for (const RowUse& use : plan.rows) {
    if (use.seq->status != SeqStatus::kFinished) ApplyRow(use, out, appended_);
  }
  Mark(StepPhase::kBookkeeping);
  for (Sequence* seq : appended_) CheckStop(*seq);
  if (config_.jump_forward) {
    for (Sequence* seq : appended_) JumpForward(*seq);
  }
  Mark(StepPhase::kStopChecks);
  CollectOutputs(outs, used);
  Mark(StepPhase::kOutputs);
}

void Engine::ApplyRow(const RowUse& use, const ForwardOutput& out,
                      std::vector<Sequence*>& appended) {
  KVSERVE_CHECK_THREAD(engine_thread_);
  Sequence& seq = *use.seq;
  Request& req = *seq.request;
  if (use.host_row >= 0) {  // a prompt position's logits, kept for the request's last output
    const int vocab = model_config_.vocab_size;
    const float* row = out.logits.data() + int64_t{use.host_row} * vocab;
    req.prompt_logits.resize(static_cast<size_t>(seq.num_prompt_tokens) * vocab);
    std::copy(row, row + vocab, req.prompt_logits.begin() + int64_t{use.position} * vocab);
  }
  if (use.prompt_logprobs >= 0 && !req.prompt_logprobs_sent) {  // kept for the first output
    req.prompt_logprobs.resize(seq.num_prompt_tokens - 1);
    req.prompt_logprobs[use.position] = out.logprobs[use.prompt_logprobs];
  }
  if (use.num_samples == 0) return;
  absl::Span<const int32_t> tokens(out.tokens.data() + use.first_sample, use.num_samples);
  const TokenLogprobs* logprobs =
      use.first_logprobs >= 0 ? out.logprobs.data() + use.first_logprobs : nullptr;
  std::vector<TokenLogprobs> with_given;  // the draws' logprobs with the given ids' in `top`
  if (logprobs != nullptr && use.given_logprobs >= 0) {
    with_given.assign(logprobs, logprobs + use.num_samples);
    const std::vector<int32_t>& ids = req.input.sampling.logprob_token_ids;
    for (TokenLogprobs& lp : with_given) {
      for (size_t i = 0; i < ids.size(); ++i) {
        lp.top.emplace_back(ids[i], out.logprobs[use.given_logprobs + i].logprob);
      }
    }
    logprobs = with_given.data();
  }
  if (use.num_samples > 1) {
    Fork(req, tokens, logprobs, appended);
  } else {
    req.forked = true;
    AppendToken(seq, tokens[0], logprobs);
    appended.push_back(&seq);
  }
}

void Engine::CollectOutputs(std::vector<SequenceOutput>& outs, size_t& used) {
  KVSERVE_CHECK_THREAD(engine_thread_);
  // Only a sequence that got a token this step has something to say (CheckStop alone ends
  // one), so the walk is over those, in the batch's order, while they are still in the cache.
  // Each output overwrites an element of `outs` from `used` on whole (every field), reusing
  // its memory.
  size_t& n = used;
  std::vector<const std::string*> done;
  for (Sequence* seq : appended_) {
    Request& req = *seq->request;
    const bool finishing = seq->finish_reason != FinishReason::kNone;
    if (n == outs.size()) outs.emplace_back();
    SequenceOutput& o = outs[n++];
    o.request_id.assign(req.input.request_id);
    o.sample_index = seq->sample_index;
    o.new_tokens.assign(seq->tokens.begin() + seq->num_prompt_tokens + seq->num_emitted,
                        seq->tokens.end());
    o.new_logprobs.clear();
    if (!seq->logprobs.empty()) {
      o.new_logprobs.assign(seq->logprobs.begin() + seq->num_emitted, seq->logprobs.end());
    }
    seq->num_emitted = seq->tokens.size() - seq->num_prompt_tokens;
    o.finish_reason = seq->finish_reason;
    o.stop_token = seq->stop_token;
    o.request_finished = false;
    o.num_prompt_tokens = seq->num_prompt_tokens;
    o.num_cached_prompt_tokens = std::max(0, req.num_cached_prompt_tokens);
    o.prompt_logits.clear();
    o.prompt_logprobs.clear();
    if (req.input.sampling.prompt_logprobs && !req.prompt_logprobs_sent) {
      o.prompt_logprobs = std::move(req.prompt_logprobs);
      req.prompt_logprobs_sent = true;
    }
    if (!finishing) continue;
    scheduler_->Remove(seq);
    seq->status = SeqStatus::kFinished;
    // The request ends with the output of its last sequence to finish.
    const bool all_finished =
        std::all_of(req.sequences.begin(), req.sequences.end(),
                    [](const auto& s) { return s->status == SeqStatus::kFinished; });
    if (req.forked && all_finished) {
      o.request_finished = true;
      o.prompt_logits = std::move(req.prompt_logits);
      done.push_back(&req.input.request_id);
    }
  }
  for (const std::string* id : done) {  // kept while a step in flight may name them
    auto it = requests_.find(*id);
    retiring_.push_back(std::move(it->second));
    requests_.erase(it);
  }
}

}  // namespace kvserve::worker
