#include "worker/scheduler/scheduler.h"

#include <memory>

#include "gtest/gtest.h"

namespace kvserve::worker {
namespace {

class SchedulerTest : public ::testing::Test {
 protected:
  Sequence* NewSeq(int prompt_len, int priority = 0) {
    auto req = std::make_unique<Request>();
    req->input.priority = priority;
    req->arrival = static_cast<int64_t>(requests_.size());
    auto seq = std::make_unique<Sequence>();
    seq->id = static_cast<int64_t>(requests_.size());
    seq->request = req.get();
    seq->tokens.assign(prompt_len, 1);
    seq->num_prompt_tokens = prompt_len;
    Sequence* raw = seq.get();
    req->sequences.push_back(std::move(seq));
    requests_.push_back(std::move(req));
    return raw;
  }
  static void Complete(const Scheduler::Output& out) {
    for (const auto& s : out.scheduled) s.seq->num_computed_tokens += s.num_new_tokens;
  }
  std::vector<std::unique_ptr<Request>> requests_;
};

TEST_F(SchedulerTest, ChunkedPrefillRespectsTheTokenBudget) {
  KvCacheManager kv({.num_blocks = 64, .block_size = 16, .enable_prefix_caching = false});
  Scheduler sched({.max_num_seqs = 8, .max_num_batched_tokens = 100}, &kv);
  Sequence* a = NewSeq(250);
  Sequence* b = NewSeq(30);
  sched.Add(a);
  sched.Add(b);
  auto out = sched.Schedule();
  ASSERT_EQ(out.scheduled.size(), 1u);  // a takes the whole budget
  EXPECT_EQ(out.scheduled[0].num_new_tokens, 100);
  Complete(out);
  out = sched.Schedule();
  Complete(out);
  out = sched.Schedule();
  ASSERT_EQ(out.scheduled.size(), 2u);
  EXPECT_EQ(out.scheduled[0].num_new_tokens, 50);  // the rest of a
  EXPECT_EQ(out.scheduled[1].num_new_tokens, 30);  // b fits beside it
}

TEST_F(SchedulerTest, ShortPromptsAreNotStuckBehindLongOnes) {
  KvCacheManager kv({.num_blocks = 256, .block_size = 16, .enable_prefix_caching = false});
  Scheduler sched({.max_num_seqs = 8,
                   .max_num_batched_tokens = 512,
                   .long_prefill_token_threshold = 64,
                   .max_num_partial_prefills = 3,
                   .max_long_partial_prefills = 1},
                  &kv);
  Sequence* long1 = NewSeq(1000);
  Sequence* long2 = NewSeq(900);
  Sequence* short1 = NewSeq(20);
  sched.Add(long1);
  sched.Add(long2);
  sched.Add(short1);
  auto out = sched.Schedule();
  // long1 prefills at most 64 tokens; long2 waits (one long prefill at a time); short1 runs.
  ASSERT_EQ(out.scheduled.size(), 2u);
  EXPECT_EQ(out.scheduled[0].seq, long1);
  EXPECT_EQ(out.scheduled[0].num_new_tokens, 64);
  EXPECT_EQ(out.scheduled[1].seq, short1);
  EXPECT_EQ(out.scheduled[1].num_new_tokens, 20);
  EXPECT_EQ(sched.num_waiting(), 1);
}

TEST_F(SchedulerTest, PriorityThenArrival) {
  KvCacheManager kv({.num_blocks = 64, .block_size = 16, .enable_prefix_caching = false});
  Scheduler sched({.max_num_seqs = 1, .max_num_batched_tokens = 100}, &kv);
  Sequence* low = NewSeq(10, /*priority=*/5);
  Sequence* high = NewSeq(10, /*priority=*/-1);
  sched.Add(low);
  sched.Add(high);
  auto out = sched.Schedule();
  ASSERT_EQ(out.scheduled.size(), 1u);
  EXPECT_EQ(out.scheduled[0].seq, high);
}

TEST_F(SchedulerTest, PreemptsTheLatestWhenBlocksRunOut) {
  KvCacheManager kv({.num_blocks = 4, .block_size = 4, .enable_prefix_caching = false});
  Scheduler sched({.max_num_seqs = 4, .max_num_batched_tokens = 100}, &kv);
  Sequence* a = NewSeq(7);
  Sequence* b = NewSeq(7);
  sched.Add(a);
  sched.Add(b);
  auto out = sched.Schedule();
  ASSERT_EQ(out.scheduled.size(), 2u);  // 2 + 2 blocks
  Complete(out);
  a->tokens.push_back(2);
  b->tokens.push_back(2);
  out = sched.Schedule();  // position 7 still fits in each sequence's second block
  Complete(out);
  a->tokens.push_back(3);
  b->tokens.push_back(3);
  out = sched.Schedule();  // position 8 needs a 3rd block for a: b is preempted
  ASSERT_EQ(out.preempted.size(), 1u);
  EXPECT_EQ(out.preempted[0], b);
  EXPECT_EQ(b->num_computed_tokens, 0);
  EXPECT_TRUE(b->block_table.empty());
  EXPECT_EQ(sched.counters().preemptions, 1);
  EXPECT_EQ(sched.num_waiting(), 1);
}

// Runs a step as the engine would: the scheduled tokens computed, a token drawn for each
// sequence that reached its end. Returns each scheduled sequence's token count, and checks
// that the step's logits rows (one per prompt token of a request returning prompt logits, one
// per sampled token) stay within `max_rows`.
std::vector<int> RunStep(Scheduler& sched, int max_rows) {
  const Scheduler::Output out = sched.Schedule();
  std::vector<int> counts;
  int rows = 0;
  for (const auto& [seq, n] : out.scheduled) {
    counts.push_back(n);
    const int start = seq->num_computed_tokens, end = start + n;
    const bool prompt_logits = seq->request->input.return_prompt_logits;
    for (int pos = start; pos < end; ++pos) {
      rows += (prompt_logits && pos < seq->num_prompt_tokens) || pos + 1 == seq->num_tokens();
    }
    seq->num_computed_tokens = end;
    if (end == seq->num_tokens()) seq->tokens.push_back(1);
  }
  EXPECT_LE(rows, max_rows);
  return counts;
}

using Counts = std::vector<int>;

// A step computes at most max_logit_rows rows of logits: a prompt whose request returns its
// prompt logits is prefilled in the rows the others leave, beside a decoding sequence and a
// prompt admitted behind it (whose chunk short of its last token needs no row).
TEST_F(SchedulerTest, PromptLogitsArePrefilledInTheRowsLeft) {
  KvCacheManager kv({.num_blocks = 64, .block_size = 16, .enable_prefix_caching = false});
  Scheduler sched({.max_num_seqs = 4, .max_num_batched_tokens = 100, .max_logit_rows = 4}, &kv);
  Sequence* decoding = NewSeq(10);
  sched.Add(decoding);
  RunStep(sched, 4);
  Sequence* logits = NewSeq(14);
  logits->request->input.return_prompt_logits = true;
  sched.Add(logits);
  sched.Add(NewSeq(5));
  // decoding 1 row + 3 prompt rows; the 5-token prompt all but its last token (no row).
  EXPECT_EQ(RunStep(sched, 4), (Counts{1, 3, 4}));
  // Then a row each for the two others: 2 prompt rows a step, the last token alone.
  std::vector<int> chunks;
  while (!logits->prefill_done()) chunks.push_back(RunStep(sched, 4).at(1));
  EXPECT_EQ(chunks, (Counts{2, 2, 2, 2, 2, 1}));

  // Without a bound (0), the prompt goes in one step.
  KvCacheManager kv2({.num_blocks = 64, .block_size = 16, .enable_prefix_caching = false});
  Scheduler unbounded({.max_num_seqs = 4, .max_num_batched_tokens = 100}, &kv2);
  Sequence* whole = NewSeq(50);
  whole->request->input.return_prompt_logits = true;
  unbounded.Add(whole);
  EXPECT_EQ(RunStep(unbounded, 51), (Counts{50}));
}

// A request counts for its n samples from admission on, before it forks into them, so that the
// running sequences stay within max_num_seqs (and the logits rows reserved for them).
TEST_F(SchedulerTest, AdmissionCountsTheSamplesARequestWillForkInto) {
  KvCacheManager kv({.num_blocks = 64, .block_size = 16, .enable_prefix_caching = false});
  Scheduler sched({.max_num_seqs = 4, .max_num_batched_tokens = 100}, &kv);
  Sequence* three = NewSeq(10);
  three->request->input.sampling.n = 3;
  Sequence* one = NewSeq(10);
  Sequence* waits = NewSeq(10);
  for (Sequence* s : {three, one, waits}) sched.Add(s);
  auto out = sched.Schedule();
  ASSERT_EQ(out.scheduled.size(), 2u) << "3 + 1 slots of 4";
  EXPECT_EQ(out.scheduled[0].seq, three);
  EXPECT_EQ(out.scheduled[1].seq, one);
  EXPECT_EQ(sched.num_waiting(), 1);
  // Forked (as the engine does after the prompt): the same 4 slots, in 4 sequences.
  Complete(out);
  three->request->forked = true;
  for (int i = 1; i < 3; ++i) {
    auto child = std::make_unique<Sequence>();
    child->request = three->request;
    child->sample_index = i;
    child->tokens = three->tokens;
    child->num_prompt_tokens = three->num_prompt_tokens;
    kv.Fork(*three, *child);
    sched.AddRunning(child.get());
    three->request->sequences.push_back(std::move(child));
  }
  for (Sequence* s : sched.running()) s->tokens.push_back(1);
  out = sched.Schedule();
  EXPECT_EQ(out.scheduled.size(), 4u);
  EXPECT_EQ(sched.num_waiting(), 1) << "still no slot for the third request";
}

// The rows go first come, first served, but a prompt with logits leaves a row for each running
// sequence behind it.
TEST_F(SchedulerTest, PromptLogitsLeaveARowForEachRunningSequenceBehind) {
  KvCacheManager kv({.num_blocks = 64, .block_size = 16, .enable_prefix_caching = false});
  Scheduler sched({.max_num_seqs = 4, .max_num_batched_tokens = 100, .max_logit_rows = 4}, &kv);
  Sequence* logits = NewSeq(20);
  logits->request->input.return_prompt_logits = true;
  for (Sequence* s : {logits, NewSeq(3), NewSeq(3)}) sched.Add(s);
  EXPECT_EQ(RunStep(sched, 4), (Counts{4, 2, 2})) << "all 4 rows to the prompt's logits";
  EXPECT_EQ(RunStep(sched, 4), (Counts{2, 1, 1})) << "a row each for the two behind it";
  EXPECT_EQ(RunStep(sched, 4), (Counts{2, 1, 1}));
}

}  // namespace
}  // namespace kvserve::worker
