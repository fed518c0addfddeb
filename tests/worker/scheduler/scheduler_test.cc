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

}  // namespace
}  // namespace kvserve::worker
