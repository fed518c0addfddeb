#include "worker/scheduler/scheduler.h"

#include <algorithm>
#include <limits>

#include "absl/container/flat_hash_set.h"
#include "glog/logging.h"

namespace kvserve::worker {
namespace {

bool Before(const Sequence* a, const Sequence* b) {
  if (a->request->input.priority != b->request->input.priority) {
    return a->request->input.priority < b->request->input.priority;
  }
  if (a->request->arrival != b->request->arrival) return a->request->arrival < b->request->arrival;
  return a->sample_index < b->sample_index;
}

bool Prefilling(const Sequence& seq) { return seq.num_tokens() - seq.num_computed_tokens > 1; }

bool ReturnsPromptLogits(const Sequence& seq) {
  return seq.request->input.needs_prompt_rows() && seq.sample_index == 0;
}

// The running slots a sequence takes: a request's first sequence before it forks holds one for
// each of its n samples.
int Slots(const Sequence& seq) {
  return seq.sample_index == 0 && !seq.request->forked ? seq.request->input.sampling.n : 1;
}

}  // namespace

void Scheduler::Add(Sequence* seq) {
  CHECK(seq->block_table.empty());
  seq->status = SeqStatus::kWaiting;
  waiting_.push_back(seq);
}

void Scheduler::AddRunning(Sequence* seq) {
  seq->status = SeqStatus::kRunning;
  running_.push_back(seq);
}

void Scheduler::Remove(Sequence* seq) {
  std::erase(running_, seq);
  std::erase(waiting_, seq);
  std::erase(swapped_, seq);
  kv_->Free(*seq);
}

bool Scheduler::IsLong(const Sequence& seq) const {
  return config_.long_prefill_token_threshold > 0 &&
         seq.num_tokens() - seq.num_computed_tokens > config_.long_prefill_token_threshold;
}

int Scheduler::ChunkLimit(int remaining) const {
  if (config_.long_prefill_token_threshold > 0) {
    return std::min(remaining, config_.long_prefill_token_threshold);
  }
  return remaining;
}

int Scheduler::LogitRows(const Sequence& seq, int start, int n) {
  const int end = start + n;
  const bool prompt_logits = ReturnsPromptLogits(seq);
  const int prompt_rows =
      prompt_logits ? std::max(0, std::min(end, seq.num_prompt_tokens) - start) : 0;
  // The last token samples; a prompt token's row is already counted.
  const bool sample_row =
      end == seq.num_tokens() && !(prompt_logits && end <= seq.num_prompt_tokens);
  return prompt_rows + (sample_row ? 1 : 0);
}

int Scheduler::FitRows(const Sequence& seq, int start, int n, int rows) {
  rows = std::max(rows, 0);
  if (LogitRows(seq, start, n) <= rows) return n;
  // Fewer tokens: the prompt positions that fit (a row each), or all but the last token when
  // the prompt's rows fit and the last one's would not.
  const int prompt_left = ReturnsPromptLogits(seq) ? std::max(0, seq.num_prompt_tokens - start) : 0;
  return rows < prompt_left ? rows : n - 1;
}

void Scheduler::Preempt(Sequence* seq) {
  std::erase(running_, seq);
  ++counters_.preemptions;
  if (config_.preemption_mode != PreemptionMode::kRecompute && kv_->CanSwapOut(*seq)) {
    kv_->SwapOut(*seq);
    swapped_.push_back(seq);
    ++counters_.swap_preemptions;
    return;
  }
  kv_->Free(*seq);
  seq->num_computed_tokens = 0;
  seq->status = SeqStatus::kWaiting;
  waiting_.push_back(seq);
  ++counters_.recompute_preemptions;
}

bool Scheduler::PreemptOne() {
  if (running_.empty()) return false;
  std::sort(running_.begin(), running_.end(), Before);
  Preempt(running_.back());
  return true;
}

bool Scheduler::PrefillAllowed(const Sequence& seq, const StepBudget& b) const {
  if (!Prefilling(seq)) return true;
  if (config_.max_num_partial_prefills > 0 && b.prefills >= config_.max_num_partial_prefills) {
    return false;
  }
  return !IsLong(seq) || b.long_prefills < config_.max_long_partial_prefills;
}

void Scheduler::CountPrefill(const Sequence& seq, StepBudget& b) const {
  if (!Prefilling(seq)) return;
  ++b.prefills;
  if (IsLong(seq)) ++b.long_prefills;
}

void Scheduler::Take(Sequence* seq, int start, int n, StepBudget& b, Output& out) {
  out.scheduled.push_back({seq, n});
  b.tokens -= n;
  b.rows -= LogitRows(*seq, start, n);
}

Scheduler::Output Scheduler::Schedule(bool may_preempt) {
  Output out;
  StepBudget b;
  b.tokens = config_.max_num_batched_tokens;
  b.rows = config_.max_logit_rows > 0 ? config_.max_logit_rows : std::numeric_limits<int>::max();
  for (const Sequence* seq : running_) b.slots += Slots(*seq);
  ScheduleRunning(b, may_preempt, out);
  // No admissions while memory is short.
  if (!out.preempted.empty() || out.blocked) return out;
  ScheduleSwapped(b, out);
  if (!swapped_.empty()) return out;
  AdmitWaiting(b, out);
  return out;
}

// Running sequences in priority order; when blocks run out, the lowest-priority, latest one is
// preempted (possibly the one being scheduled).
void Scheduler::ScheduleRunning(StepBudget& b, bool may_preempt, Output& out) {
  // Sorted already at steady state (a step appends admissions in order): one pass checks it.
  if (!std::is_sorted(running_.begin(), running_.end(), Before)) {
    std::sort(running_.begin(), running_.end(), Before);
  }
  out.scheduled.reserve(running_.size());
  std::vector<Sequence*> snapshot = running_;
  int later = static_cast<int>(snapshot.size());
  for (Sequence* seq : snapshot) {
    --later;
    if (b.tokens == 0) break;
    if (seq->status != SeqStatus::kRunning) continue;  // preempted earlier in this loop
    if (seq->ends_when_applied) continue;              // its last token is on its way
    if (!PrefillAllowed(*seq, b)) continue;
    const int start = seq->num_computed_tokens;
    // A prompt's rows leave one for each running sequence after it.
    const int n = FitRows(*seq, start, std::min(ChunkLimit(seq->num_tokens() - start), b.tokens),
                          ReturnsPromptLogits(*seq) ? b.rows - later : b.rows);
    if (n == 0) continue;
    bool ok = kv_->Allocate(*seq, n, {});
    if (!ok && !may_preempt) {
      out.blocked = true;
      return;
    }
    while (!ok) {
      Sequence* victim = running_.back();
      Preempt(victim);
      out.preempted.push_back(victim);
      if (victim == seq) break;
      ok = kv_->Allocate(*seq, n, {});
    }
    if (!ok) continue;
    CountPrefill(*seq, b);
    Take(seq, start, n, b, out);
  }
}

// Swapped sequences come back first, in priority order, when their blocks fit again.
void Scheduler::ScheduleSwapped(StepBudget& b, Output& out) {
  std::sort(swapped_.begin(), swapped_.end(), Before);
  std::vector<Sequence*> swapped_in;
  for (Sequence* seq : swapped_) {
    if (b.tokens == 0 || b.slots + Slots(*seq) > config_.max_num_seqs) break;
    const int start = seq->num_computed_tokens;
    const int n =
        FitRows(*seq, start, std::min(ChunkLimit(seq->num_tokens() - start), b.tokens), b.rows);
    if (n == 0) break;
    const int bs = kv_->block_size();
    const int extra = std::max<int>(0, (seq->num_computed_tokens + n + bs - 1) / bs -
                                           static_cast<int>(seq->block_table.size()));
    if (!kv_->CanSwapIn(*seq, extra)) break;  // swapped-in blocks are private: no copy-on-write
    kv_->SwapIn(*seq);
    CHECK(kv_->Allocate(*seq, n, {}));
    running_.push_back(seq);
    b.slots += Slots(*seq);
    swapped_in.push_back(seq);
    Take(seq, start, n, b, out);
  }
  for (Sequence* seq : swapped_in) std::erase(swapped_, seq);
}

// Waiting sequences in priority order, from their longest cached prefix. Full blocks that
// running prefills have yet to compute become cached as they are: a waiting prompt whose next
// uncached block is one of them waits for it instead of computing it a second time, so that
// prompts of one prefix group that arrive together share it.
void Scheduler::AdmitWaiting(StepBudget& b, Output& out) {
  std::sort(waiting_.begin(), waiting_.end(), Before);
  absl::flat_hash_set<BlockHash> being_computed;
  auto add_uncomputed = [&](const Sequence& s) {
    for (size_t i = s.num_computed_tokens / kv_->block_size(); i < s.block_hashes.size(); ++i) {
      being_computed.insert(s.block_hashes[i]);
    }
  };
  if (kv_->prefix_caching()) {
    for (const Sequence* r : running_) {
      if (Prefilling(*r)) add_uncomputed(*r);
    }
  }
  std::vector<Sequence*> admitted;
  for (Sequence* seq : waiting_) {
    if (b.tokens == 0 || b.slots + Slots(*seq) > config_.max_num_seqs) break;
    if (!PrefillAllowed(*seq, b)) continue;
    const bool want_logits = seq->request->input.needs_prompt_rows();
    std::vector<CachedBlock> cached =
        want_logits ? std::vector<CachedBlock>() : kv_->FindCachedBlocks(*seq);
    const size_t usable = static_cast<size_t>((seq->num_tokens() - 1) / kv_->block_size());
    if (!want_logits && cached.size() < std::min(usable, seq->block_hashes.size()) &&
        being_computed.contains(seq->block_hashes[cached.size()])) {
      ++counters_.prefix_waits;
      continue;  // its next block is being computed by a running request: take it next step
    }
    const int cached_tokens = static_cast<int>(cached.size()) * kv_->block_size();
    const int n =
        FitRows(*seq, cached_tokens,
                std::min(ChunkLimit(seq->num_tokens() - cached_tokens), b.tokens), b.rows);
    if (n == 0) break;
    if (!kv_->Allocate(*seq, n, cached)) break;
    counters_.prefix_queried_tokens += seq->num_tokens();
    counters_.prefix_hit_tokens += cached_tokens;
    if (seq->request->num_cached_prompt_tokens < 0) {
      seq->request->num_cached_prompt_tokens = cached_tokens;
    }
    CountPrefill(*seq, b);
    seq->status = SeqStatus::kRunning;
    running_.push_back(seq);
    b.slots += Slots(*seq);
    admitted.push_back(seq);
    if (kv_->prefix_caching() && !want_logits) add_uncomputed(*seq);
    Take(seq, cached_tokens, n, b, out);
  }
  for (Sequence* seq : admitted) std::erase(waiting_, seq);
}

}  // namespace kvserve::worker
