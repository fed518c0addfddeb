// Continuous batching: each step picks which sequences run and how many of their tokens,
// under a token budget (--max-num-batched-tokens) and a sequence cap (--max-num-seqs; a request
// counts for the n samples it will fork into from admission on, as in vLLM).
// Running sequences come first (decodes and unfinished prefills), then waiting ones by
// priority (lower first), then arrival. Prompts are prefilled in chunks that fit the budget.
// When the KV pool runs out, the lowest-priority, latest running sequence is preempted: by
// swapping its blocks to the host tier (--preemption-mode swap, or auto when the host tier
// has room) or by recompute (its blocks are freed, cached full blocks stay findable, and it
// waits again). Swapped sequences come back before any new request is admitted.
//
// Long prompts (longer than --long-prefill-token-threshold, when set) prefill at most that
// many tokens per step, and at most --max-long-partial-prefills of them prefill at once;
// --max-num-partial-prefills caps the prefilling sequences per step. Short prompts are then
// admitted beside a long one instead of queueing behind it.
//
// A step computes at most max_logit_rows rows of logits (the rows the model reserved): a prompt
// whose request returns its prompt logits is prefilled in chunks that fit the rows left.
//
// The contract (vLLM's SchedulerInterface has the same shape):
// - Given, between steps: the sequences to consider (Add: a new request's, or one back from a
//   recompute; AddRunning: a forked sample that holds its parent's blocks; Remove: one that
//   finished or was aborted, whose blocks it frees) and, through the KvCacheManager it was made
//   with, the pool's blocks. Each Sequence's computed and appended tokens are the engine's to
//   update (Engine::UpdateFromOutput) before the next call.
// - Returns, once a step (Schedule): the sequences that run and how many new tokens each
//   computes (with their blocks allocated), those preempted (swapped to the host tier or freed
//   for recompute), and `blocked` when, without may_preempt, it ran out of blocks. The block
//   copies the step must do first (copy-on-write, swaps) are the KvCacheManager's, taken by the
//   caller (KvCacheManager::TakeCopies).
// - Called by Engine::RunStep (worker/engine_step.cc) once per step, and by Engine::AddRequest,
//   Engine::Abort and the step's fork and finish paths; all on the engine thread. Not
//   thread-safe, and it never blocks: it only chooses.
//
//   Scheduler sched(config, &kv_cache);
//   sched.Add(seq);
//   Scheduler::Output out = sched.Schedule();  // run out.scheduled after kv_cache's copies
#ifndef KVSERVE_WORKER_SCHEDULER_SCHEDULER_H_
#define KVSERVE_WORKER_SCHEDULER_SCHEDULER_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "worker/kv_cache/kv_cache_manager.h"
#include "worker/request/request.h"

namespace kvserve::worker {

enum class PreemptionMode { kAuto, kSwap, kRecompute };

struct SchedulerConfig {
  int max_num_seqs = 256;
  int max_num_batched_tokens = 2048;
  int long_prefill_token_threshold = 0;  // 0: no long-prompt handling
  int max_num_partial_prefills = 0;      // 0: no cap
  int max_long_partial_prefills = 1;
  PreemptionMode preemption_mode = PreemptionMode::kAuto;
  // Logits rows a step may compute: one per sequence that samples, and one per prompt token of
  // a request that returns its prompt logits. The model reserves this many rows at start-up
  // (the engine sets it to max_num_seqs), so prompt logits are prefilled in chunks that fit
  // instead of growing device buffers mid-serving, where running out of memory would end the
  // process (vLLM #5907). 0: no bound. At least max_num_seqs, so that every running sequence
  // can sample in every step (with fewer, the later ones wait a step).
  int max_logit_rows = 0;
};

class Scheduler {
 public:
  struct ScheduledSeq {
    Sequence* seq;
    int num_new_tokens;
  };
  struct Output {
    std::vector<ScheduledSeq> scheduled;
    std::vector<Sequence*> preempted;
    // Without may_preempt: a running sequence found no blocks and nothing was preempted; the
    // step is not complete (the caller settles what it waits for and schedules again).
    bool blocked = false;
  };
  struct Counters {
    int64_t preemptions = 0;
    int64_t swap_preemptions = 0;
    int64_t recompute_preemptions = 0;
    int64_t prefix_queried_tokens = 0;
    int64_t prefix_hit_tokens = 0;
    int64_t prefix_waits = 0;  // admissions put off a step for a block a running prefill computes
  };

  Scheduler(const SchedulerConfig& config, KvCacheManager* kv) : config_(config), kv_(kv) {}

  // Queues a sequence that has no blocks (a new request, or one coming back).
  void Add(Sequence* seq);
  // Adds a sequence that already holds blocks (a forked sample) to the running set.
  void AddRunning(Sequence* seq);
  // Drops the sequence from the queues and frees its blocks (finished or aborted).
  void Remove(Sequence* seq);

  // One step's choice: running sequences first (preempting when blocks run out), then swapped
  // ones back when nothing was preempted, then waiting ones when nothing is left swapped.
  // Running sequences that end_when_applied are left out. Without `may_preempt` (a step is in
  // flight: its sequences' last tokens are placeholders, which a recompute would feed back),
  // running out of blocks ends the choice as `blocked`; the blocks allocated so far stay, and
  // the next call finds them.
  Output Schedule(bool may_preempt = true);

  [[nodiscard]] int num_running() const { return static_cast<int>(running_.size()); }
  [[nodiscard]] int num_waiting() const { return static_cast<int>(waiting_.size()); }
  [[nodiscard]] int num_swapped() const { return static_cast<int>(swapped_.size()); }
  [[nodiscard]] const Counters& counters() const { return counters_; }
  [[nodiscard]] const std::vector<Sequence*>& running() const { return running_; }
  [[nodiscard]] const std::vector<Sequence*>& waiting() const { return waiting_; }

  // Forces the lowest-priority running sequence out the way memory pressure would (tests).
  bool PreemptOne();

 private:
  // What one Schedule() call has left to give out, and the prefills it started.
  struct StepBudget {
    int tokens = 0;  // of --max-num-batched-tokens
    int rows = 0;    // logits rows (SchedulerConfig::max_logit_rows)
    int slots = 0;   // running slots taken (--max-num-seqs), forks to come included
    int prefills = 0, long_prefills = 0;
  };
  // The phases of Schedule().
  void ScheduleRunning(StepBudget& b, bool may_preempt, Output& out);
  void ScheduleSwapped(StepBudget& b, Output& out);
  void AdmitWaiting(StepBudget& b, Output& out);
  // Whether `seq` may prefill in this step (--max-num-partial-prefills and the long-prompt
  // cap), and its count once it does.
  [[nodiscard]] bool PrefillAllowed(const Sequence& seq, const StepBudget& b) const;
  void CountPrefill(const Sequence& seq, StepBudget& b) const;
  // Takes `n` tokens of `seq` from `start` into the step.
  static void Take(Sequence* seq, int start, int n, StepBudget& b, Output& out);
  bool IsLong(const Sequence& seq) const;
  // Tokens a sequence with `remaining` uncomputed tokens may compute in one step.
  int ChunkLimit(int remaining) const;
  // The logits rows `n` tokens of `seq` from position `start` need: one per prompt position
  // when it returns prompt logits, and one for its last token, which samples.
  static int LogitRows(const Sequence& seq, int start, int n);
  // The most of those `n` tokens whose logits rows fit in `rows` (0 when none do).
  static int FitRows(const Sequence& seq, int start, int n, int rows);
  void Preempt(Sequence* seq);

  SchedulerConfig config_;
  KvCacheManager* kv_;
  std::vector<Sequence*> running_;
  std::vector<Sequence*> waiting_;
  std::vector<Sequence*> swapped_;
  Counters counters_;
};

}  // namespace kvserve::worker

#endif  // KVSERVE_WORKER_SCHEDULER_SCHEDULER_H_
