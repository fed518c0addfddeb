#include "router/routing/prefix_index.h"

#include <algorithm>
#include <numeric>
#include <optional>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "router/routing/snapshot_build.h"

namespace kvserve::router {
namespace {

namespace pb = ::kvserve::v1;

std::vector<BlockHash> Chain(int n, uint64_t salt = 0) {
  std::vector<uint32_t> tokens(n * 4);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(i + salt * 1000);
  return HashFullBlocks(tokens, 4, "k");
}

pb::KvEventBatch Batch(uint64_t instance, uint64_t seq, const std::vector<BlockHash>& stored,
                       pb::Medium medium = pb::MEDIUM_DEVICE,
                       const std::vector<BlockHash>& removed = {}) {
  pb::KvEventBatch b;
  b.set_instance_id(instance);
  b.set_seq(seq);
  if (!stored.empty()) {
    pb::BlockStored* s = b.add_events()->mutable_stored();
    s->set_medium(medium);
    for (const BlockHash& h : stored) s->add_block_hashes(h.ToBytes());
  }
  if (!removed.empty()) {
    pb::BlockRemoved* r = b.add_events()->mutable_removed();
    r->set_medium(medium);
    for (const BlockHash& h : removed) r->add_block_hashes(h.ToBytes());
  }
  return b;
}

TEST(PrefixIndexTest, EventsBuildLeadingMatchesPerTier) {
  PrefixIndex index;
  const auto chain = Chain(6);
  EXPECT_EQ(index.ApplyEvents(0, Batch(7, 1, {chain[0], chain[1], chain[2]})),
            PrefixIndex::Apply::kApplied);
  EXPECT_EQ(index.ApplyEvents(0, Batch(7, 2, {chain[3]}, pb::MEDIUM_HOST)),
            PrefixIndex::Apply::kApplied);
  PrefixIndex::Match m = index.LongestPrefix(0, chain);
  EXPECT_EQ(m.device_blocks, 3);
  EXPECT_EQ(m.host_blocks, 1);
  EXPECT_EQ(index.LongestPrefix(0, Chain(6, 1)).total(), 0);
  // Removing block 1 cuts the chain there.
  EXPECT_EQ(index.ApplyEvents(0, Batch(7, 3, {}, pb::MEDIUM_DEVICE, {chain[1]})),
            PrefixIndex::Apply::kApplied);
  EXPECT_EQ(index.LongestPrefix(0, chain).total(), 1);
  EXPECT_EQ(index.ApplyEvents(0, Batch(7, 3, {chain[1]})),
            PrefixIndex::Apply::kIgnored);  // duplicate
}

TEST(PrefixIndexTest, GapsNeedASnapshotAndRestartsClear) {
  PrefixIndex index;
  const auto chain = Chain(4);
  index.ApplyEvents(1, Batch(9, 1, {chain[0]}));
  EXPECT_EQ(index.ApplyEvents(1, Batch(9, 3, {chain[1]})), PrefixIndex::Apply::kGap);
  EXPECT_FALSE(index.synced(1));
  EXPECT_EQ(index.ApplyEvents(1, Batch(9, 4, {chain[2]})),
            PrefixIndex::Apply::kAwaitingSnapshot);  // still unsynced: no new gap
  pb::KvSnapshot snap;
  snap.set_instance_id(9);
  snap.set_seq(4);
  for (int i = 0; i < 3; ++i) {
    pb::CachedBlock* b = snap.add_blocks();
    b->set_block_hash(chain[i].ToBytes());
    b->set_medium(pb::MEDIUM_DEVICE);
  }
  index.ApplySnapshot(1, snap);
  EXPECT_TRUE(index.synced(1));
  EXPECT_EQ(index.LongestPrefix(1, chain).total(), 3);
  EXPECT_EQ(index.ApplyEvents(1, Batch(9, 5, {chain[3]})), PrefixIndex::Apply::kApplied);
  EXPECT_EQ(index.LongestPrefix(1, chain).total(), 4);
  // A new instance starting at seq 1 replaces everything.
  EXPECT_EQ(index.ApplyEvents(1, Batch(10, 1, {})), PrefixIndex::Apply::kApplied);
  EXPECT_EQ(index.LongestPrefix(1, chain).total(), 0);
  // A new instance seen mid-stream is a gap.
  EXPECT_EQ(index.ApplyEvents(1, Batch(11, 5, {chain[0]})), PrefixIndex::Apply::kGap);
}

TEST(PrefixIndexTest, AHeartbeatFromANewInstanceDropsTheOldCache) {
  PrefixIndex index;
  const auto chain = Chain(3);
  EXPECT_FALSE(index.SeeInstance(2, 7));  // nothing known yet: nothing to drop
  index.ApplyEvents(2, Batch(7, 1, chain));
  EXPECT_FALSE(index.SeeInstance(2, 7));  // same process
  EXPECT_EQ(index.LongestPrefix(2, chain).total(), 3);
  // Restarted idle: no event says so, the heartbeat does.
  EXPECT_TRUE(index.SeeInstance(2, 8));
  EXPECT_EQ(index.LongestPrefix(2, chain).total(), 0);
  EXPECT_FALSE(index.synced(2));
  pb::KvSnapshot snap;  // its (empty) snapshot resyncs it
  snap.set_instance_id(8);
  snap.set_seq(0);
  index.ApplySnapshot(2, snap);
  EXPECT_TRUE(index.synced(2));
  EXPECT_EQ(index.ApplyEvents(2, Batch(8, 1, {chain[0]})), PrefixIndex::Apply::kApplied);
  EXPECT_EQ(index.LongestPrefix(2, chain).total(), 1);
}

TEST(PrefixIndexTest, RoutedRequestsApproximateTheIndex) {
  PrefixIndex index;
  const auto chain = Chain(3);
  index.RecordRouted(2, chain);
  EXPECT_EQ(index.LongestPrefix(2, chain).device_blocks, 3);
  index.RemoveWorker(2);
  EXPECT_EQ(index.LongestPrefix(2, chain).total(), 0);
}

TEST(PrefixIndexTest, ApproximateEntriesSurviveUntilTheFirstSnapshot) {
  PrefixIndex index;
  const auto chain = Chain(2);
  index.RecordRouted(3, chain);  // routed before any event from the worker arrived
  // Joined mid-stream (the router started after the worker): a snapshot is needed, and the
  // batches before it come are not new gaps.
  EXPECT_EQ(index.ApplyEvents(3, Batch(5, 4, {})), PrefixIndex::Apply::kJoined);
  EXPECT_EQ(index.ApplyEvents(3, Batch(5, 5, {})), PrefixIndex::Apply::kAwaitingSnapshot);
  EXPECT_EQ(index.ApplyEvents(3, Batch(5, 6, {})), PrefixIndex::Apply::kAwaitingSnapshot);
  EXPECT_EQ(index.LongestPrefix(3, chain).total(), 2);
}

TEST(PrefixIndexTest, MalformedHashesAreIgnored) {
  PrefixIndex index;
  pb::KvEventBatch b;
  b.set_instance_id(1);
  b.set_seq(1);
  b.add_events()->mutable_stored()->add_block_hashes("short");
  EXPECT_EQ(index.ApplyEvents(0, b), PrefixIndex::Apply::kApplied);
  EXPECT_EQ(index.num_blocks(0), 0u);
}

// Runs longer than the index fetches ahead (and than it decodes on the stack), malformed hashes
// among them, apply each of their blocks: stored, confirming what routing assumed, and removed.
TEST(PrefixIndexTest, LongRunsApplyEveryBlock) {
  PrefixIndex index;
  const auto chain = Chain(300);
  index.RecordRouted(0, chain);  // all 300 assumed
  pb::KvEventBatch stored;
  stored.set_instance_id(1);
  stored.set_seq(1);
  pb::BlockStored* s = stored.add_events()->mutable_stored();
  s->set_medium(pb::MEDIUM_DEVICE);
  for (int i = 0; i < 200; ++i) {
    s->add_block_hashes(chain[i].ToBytes());
    if (i % 50 == 7) s->add_block_hashes("short");
  }
  ASSERT_EQ(index.ApplyEvents(0, stored), PrefixIndex::Apply::kApplied);
  // 200 confirmed, the other 100 still assumed: 300 leading blocks either way.
  EXPECT_EQ(index.num_blocks(0), 300u);
  EXPECT_EQ(index.LongestPrefix(0, chain).device_blocks, 300);
  // Confirmed entries outlive a failure of the request; assumed ones do not.
  index.ForgetRouted(0, chain);
  EXPECT_EQ(index.num_blocks(0), 200u);
  EXPECT_EQ(index.LongestPrefix(0, chain).device_blocks, 200);
  const std::vector<BlockHash> middle(chain.begin() + 100, chain.begin() + 200);
  ASSERT_EQ(index.ApplyEvents(0, Batch(1, 2, {}, pb::MEDIUM_DEVICE, middle)),
            PrefixIndex::Apply::kApplied);
  EXPECT_EQ(index.num_blocks(0), 100u);
  EXPECT_EQ(index.LongestPrefix(0, chain).device_blocks, 100);
  // Routing the whole chain again assumes only what is not confirmed.
  index.RecordRouted(0, chain);
  EXPECT_EQ(index.num_blocks(0), 300u);
}

// Asking many workers at once answers what asking each would, in their order: held, assumed,
// on the host, not known at all, and for no hashes.
TEST(PrefixIndexTest, LongestPrefixesMatchesAskingEachWorker) {
  PrefixIndex index;
  const auto chain = Chain(40);
  std::vector<int> ids;
  for (int w = 0; w < 30; ++w) {
    ids.push_back(w);
    const std::vector<BlockHash> held(chain.begin(), chain.begin() + w);
    if (w % 3 == 0) index.ApplyEvents(w, Batch(1, 1, held));
    if (w % 3 == 1) index.ApplyEvents(w, Batch(1, 1, held, pb::MEDIUM_HOST));
    if (w % 3 == 2) index.RecordRouted(w, held);
  }
  ids.push_back(99);  // never heard of
  ids.push_back(4);   // asked twice
  const std::vector<PrefixIndex::Match> all = index.LongestPrefixes(ids, chain);
  ASSERT_EQ(all.size(), ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const PrefixIndex::Match one = index.LongestPrefix(ids[i], chain);
    EXPECT_EQ(all[i].device_blocks, one.device_blocks) << "worker " << ids[i];
    EXPECT_EQ(all[i].host_blocks, one.host_blocks) << "worker " << ids[i];
  }
  EXPECT_EQ(all[27].device_blocks, 27);
  EXPECT_EQ(all[28].host_blocks, 28);
  EXPECT_EQ(all[29].device_blocks, 29);
  EXPECT_EQ(all[30].total(), 0);
  for (const PrefixIndex::Match& m : index.LongestPrefixes(ids, {})) EXPECT_EQ(m.total(), 0);
}

// The index keeps which workers hold each prompt's first block, so that a placement looks up
// those alone. Through every kind of change to a worker's entries (events of both tiers, runs
// removed, a tier cleared, assumed entries recorded, forgotten and expired, a snapshot, a new
// instance, a smaller pool, a worker removed), asking many workers at once still answers what
// asking each one would, whether few or many of them hold the prompt.
TEST(PrefixIndexTest, LongestPrefixesStayExactThroughEveryChange) {
  constexpr int kWorkers = 40, kBlocks = 8;  // roots are tracked for 32 workers asked or more
  // Six roots, each with a second prompt branching from it after 3 blocks.
  std::vector<std::vector<BlockHash>> prompts;
  for (uint32_t r = 0; r < 6; ++r) {
    std::vector<uint32_t> tokens(kBlocks * 4);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = r * 1000 + static_cast<uint32_t>(i);
    prompts.push_back(HashFullBlocks(tokens, 4, "k"));
    for (size_t i = 12; i < tokens.size(); ++i) tokens[i] += 500;
    prompts.push_back(HashFullBlocks(tokens, 4, "k"));
  }
  PrefixIndex index;
  std::mt19937 rng(5);
  const auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<uint32_t>(n)); };
  std::vector<uint64_t> instance(kWorkers, 1), seq(kWorkers, 0);
  absl::Time now = absl::UnixEpoch();
  for (int step = 0; step < 4000; ++step) {
    const int w = pick(kWorkers);
    const std::vector<BlockHash>& prompt = prompts[pick(static_cast<int>(prompts.size()))];
    const int from = pick(3) == 0 ? pick(kBlocks) : 0;
    const int to = from + 1 + pick(kBlocks - from);
    const std::vector<BlockHash> run(prompt.begin() + from, prompt.begin() + to);
    const pb::Medium medium = pick(3) == 0 ? pb::MEDIUM_HOST : pb::MEDIUM_DEVICE;
    switch (pick(12)) {
      case 0:
      case 1:
      case 2:
        index.ApplyEvents(w, Batch(instance[w], ++seq[w], run, medium));
        break;
      case 3:
        index.ApplyEvents(w, Batch(instance[w], ++seq[w], {}, medium, run));
        break;
      case 4: {
        pb::KvEventBatch b = Batch(instance[w], ++seq[w], {});
        b.add_events()->mutable_all_cleared()->set_medium(pick(2) ? medium
                                                                  : pb::MEDIUM_UNSPECIFIED);
        index.ApplyEvents(w, b);
        break;
      }
      case 5:
      case 6:
        index.RecordRouted(w, run, now);
        break;
      case 7:
        index.ForgetRouted(w, run);
        break;
      case 8:
        now += absl::Seconds(pick(20));
        index.Expire(now);
        break;
      case 9: {
        pb::KvSnapshot snap;
        snap.set_instance_id(instance[w]);
        snap.set_seq(seq[w]);
        for (const BlockHash& h : run) {
          pb::CachedBlock* b = snap.add_blocks();
          b->set_block_hash(h.ToBytes());
          b->set_medium(medium);
        }
        index.ApplySnapshot(w, snap);
        break;
      }
      case 10:  // a restart (its first batch), or a smaller pool than it holds
        if (pick(2)) {
          seq[w] = 0;
          index.ApplyEvents(w, Batch(++instance[w], ++seq[w], run, medium));
        } else {
          index.SetCapacity(w, static_cast<size_t>(pick(4) == 0 ? 2 : 0));
        }
        break;
      default:
        if (pick(8) == 0) index.RemoveWorker(w);
        break;
    }
    std::vector<int> ids(kWorkers + 1);
    std::iota(ids.begin(), ids.end(), 0);  // and one never heard of
    std::shuffle(ids.begin(), ids.end(), rng);
    if (pick(2)) ids.resize(1 + pick(kWorkers + 1));
    const std::vector<BlockHash>& asked = prompts[pick(static_cast<int>(prompts.size()))];
    const std::vector<PrefixIndex::Match> all = index.LongestPrefixes(ids, asked);
    for (size_t i = 0; i < ids.size(); ++i) {
      const PrefixIndex::Match one = index.LongestPrefix(ids[i], asked);
      ASSERT_EQ(all[i].device_blocks, one.device_blocks)
          << "step " << step << ", worker " << ids[i];
      ASSERT_EQ(all[i].host_blocks, one.host_blocks) << "step " << step << ", worker " << ids[i];
    }
    // Each tracked root lists exactly its holders: none missing (a lookup would skip it), none
    // that lost it (the list would only grow).
    for (const std::vector<BlockHash>& prompt : prompts) {
      std::vector<int> holding;
      for (int v = 0; v < kWorkers; ++v) {
        if (index.LongestPrefix(v, {prompt[0]}).total() > 0) holding.push_back(v);
      }
      const std::optional<std::vector<int>> listed = index.TrackedHolders(prompt[0]);
      if (listed.has_value()) {
        ASSERT_EQ(*listed, holding) << "step " << step;
      }
    }
  }
  EXPECT_GT(index.tracked_roots(), 0u);
}

// A root is tracked once a placement over 32 workers or more asks about it (fewer are asked
// directly), stays tracked while some worker holds it, and is forgotten when none does.
TEST(PrefixIndexTest, ARootNoWorkerHoldsIsForgotten) {
  PrefixIndex index;
  const auto chain = Chain(4);
  std::vector<int> fleet(40);
  std::iota(fleet.begin(), fleet.end(), 0);
  index.ApplyEvents(0, Batch(1, 1, {chain[0], chain[1]}));
  index.RecordRouted(1, chain);
  EXPECT_EQ(index.LongestPrefixes({0, 1, 2}, chain)[1].device_blocks, 4);
  EXPECT_EQ(index.tracked_roots(), 0u) << "three workers are asked directly";
  EXPECT_EQ(index.LongestPrefixes(fleet, chain)[1].device_blocks, 4);
  EXPECT_EQ(index.TrackedHolders(chain[0]), std::vector<int>({0, 1}));
  index.ApplyEvents(0, Batch(1, 2, {}, pb::MEDIUM_DEVICE, {chain[0]}));
  EXPECT_EQ(index.TrackedHolders(chain[0]), std::vector<int>({1})) << "worker 1 still holds it";
  index.ForgetRouted(1, chain);
  EXPECT_EQ(index.tracked_roots(), 0u);
  EXPECT_EQ(index.LongestPrefixes(fleet, chain)[0].total(), 0);
  index.RecordRouted(2, chain);  // tracked again (asked above): listed at once
  EXPECT_EQ(index.TrackedHolders(chain[0]), std::vector<int>({2}));
  EXPECT_EQ(index.LongestPrefixes(fleet, chain)[2].device_blocks, 4);
}

// A worker's stream cannot make the index hold more than the worker's pool.
TEST(PrefixIndexTest, ConfirmedEntriesAreBoundedByThePool) {
  PrefixIndex index;
  index.SetCapacity(0, 4);
  const auto chain = Chain(6);
  EXPECT_EQ(index.ApplyEvents(0, Batch(7, 1, {chain[0], chain[1], chain[2], chain[3]})),
            PrefixIndex::Apply::kApplied);
  EXPECT_EQ(index.num_blocks(0), 4u);
  // One more than the pool holds: a broken stream, cleared and resynced.
  EXPECT_EQ(index.ApplyEvents(0, Batch(7, 2, {chain[4]})), PrefixIndex::Apply::kGap);
  EXPECT_EQ(index.num_blocks(0), 0u);
  EXPECT_FALSE(index.synced(0));
  EXPECT_EQ(index.evictions(0), 5);
  // A snapshot past the pool keeps what the pool could hold.
  pb::KvSnapshot snap;
  snap.set_instance_id(7);
  snap.set_seq(9);
  for (const BlockHash& h : chain) {
    pb::CachedBlock* b = snap.add_blocks();
    b->set_block_hash(h.ToBytes());
    b->set_medium(pb::MEDIUM_DEVICE);
  }
  index.ApplySnapshot(0, snap);
  EXPECT_EQ(index.num_blocks(0), 4u);
  EXPECT_EQ(index.evictions(0), 7);
  // A smaller pool reported later clears what no longer fits.
  index.SetCapacity(0, 2);
  EXPECT_EQ(index.num_blocks(0), 0u);
}

// A snapshot (the rebuild's path, decoded and prefetched apart from Set) keeps a block listed on
// both tiers on both, skips malformed hashes, and confirms what routing had only assumed.
TEST(PrefixIndexTest, ASnapshotKeepsBothTiersAndSkipsMalformedHashes) {
  PrefixIndex index;
  const auto chain = Chain(3);
  index.RecordRouted(0, {chain[0]});
  pb::KvSnapshot snap;
  snap.set_instance_id(3);
  snap.set_seq(1);
  const auto add = [&](const std::string& hash, pb::Medium m) {
    pb::CachedBlock* b = snap.add_blocks();
    b->set_block_hash(hash);
    b->set_medium(m);
  };
  add(chain[0].ToBytes(), pb::MEDIUM_DEVICE);
  add(chain[0].ToBytes(), pb::MEDIUM_HOST);
  add("short", pb::MEDIUM_DEVICE);
  add(chain[1].ToBytes(), pb::MEDIUM_HOST);
  index.ApplySnapshot(0, snap);
  EXPECT_EQ(index.num_blocks(0), 2u);
  const PrefixIndex::Match m = index.LongestPrefix(0, chain);
  EXPECT_EQ(m.device_blocks, 1);
  EXPECT_EQ(m.host_blocks, 1);
  // Dropping the device copy of the first block leaves its host copy.
  index.ApplyEvents(0, Batch(3, 2, {}, pb::MEDIUM_DEVICE, {chain[0]}));
  EXPECT_EQ(index.LongestPrefix(0, chain).host_blocks, 2);
}

// Snapshots built on several threads (a restarted router's rebuild) install the same entries,
// in the jobs' order, as each applied on its own: the pool bound and both tiers included; bytes
// that are not a snapshot are refused by name and nothing of that worker changes.
TEST(PrefixIndexTest, SnapshotsBuiltOnThreadsMatchOnesAppliedInTurn) {
  constexpr int kWorkers = 12;
  std::vector<std::string> wire(kWorkers);
  for (int w = 0; w < kWorkers; ++w) {
    pb::KvSnapshot snap;
    snap.set_instance_id(100 + w);
    snap.set_seq(5 + w);
    for (const BlockHash& h : Chain(20 + w, w)) {
      pb::CachedBlock* b = snap.add_blocks();
      b->set_block_hash(h.ToBytes());
      b->set_medium(h.low % 3 == 0 ? pb::MEDIUM_HOST : pb::MEDIUM_DEVICE);
    }
    wire[w] = snap.SerializeAsString();
  }
  wire[7] = "\xff\xff not a snapshot";
  PrefixIndex in_turn, built;
  std::vector<SnapshotJob> jobs;
  for (int w = 0; w < kWorkers; ++w) {
    const size_t capacity = w % 4 == 0 ? 10 : 0;  // some past their pool
    in_turn.SetCapacity(w, capacity);
    built.SetCapacity(w, capacity);
    built.ApplyEvents(w, Batch(1, 1, Chain(3, 50 + w)));  // what the snapshot replaces
    pb::KvSnapshot snap;
    if (snap.ParseFromString(wire[w])) in_turn.ApplySnapshot(w, snap);
    jobs.push_back({w, wire[w], built.capacity(w)});
  }
  std::vector<BuiltSnapshot> results = BuildSnapshots(jobs, 4);
  ASSERT_EQ(results.size(), jobs.size());
  for (int w = 0; w < kWorkers; ++w) {
    ASSERT_EQ(results[w].worker, w);
    if (w == 7) {
      EXPECT_EQ(results[w].table.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_NE(results[w].table.status().message().find("KvSnapshot"), std::string::npos);
      EXPECT_EQ(built.num_blocks(w), 3u);  // not installed: the worker's entries stand
      continue;
    }
    ASSERT_TRUE(results[w].table.ok()) << results[w].table.status();
    built.InstallSnapshot(w, *std::move(results[w].table));
    EXPECT_EQ(built.num_blocks(w), in_turn.num_blocks(w)) << w;
    EXPECT_EQ(built.last_seq(w), static_cast<uint64_t>(5 + w));
    EXPECT_TRUE(built.synced(w));
    EXPECT_EQ(built.evictions(w), in_turn.evictions(w)) << w;
    const auto chain = Chain(20 + w, w);
    const PrefixIndex::Match a = built.LongestPrefix(w, chain), b = in_turn.LongestPrefix(w, chain);
    EXPECT_EQ(a.device_blocks, b.device_blocks) << w;
    EXPECT_EQ(a.host_blocks, b.host_blocks) << w;
    EXPECT_EQ(built.LongestPrefix(w, Chain(3, 50 + w)).total(), 0) << "replaced";
  }
  EXPECT_EQ(in_turn.num_blocks(4), 10u);  // the bound held
}

// A table built for a larger pool than the worker reports by the time it is installed keeps
// only what the pool holds, the rest counted as evictions.
TEST(PrefixIndexTest, ATableInstalledAfterThePoolShrankIsTrimmed) {
  PrefixIndex index;
  pb::KvSnapshot snap;
  snap.set_instance_id(2);
  snap.set_seq(3);
  for (const BlockHash& h : Chain(8)) {
    pb::CachedBlock* b = snap.add_blocks();
    b->set_block_hash(h.ToBytes());
    b->set_medium(pb::MEDIUM_DEVICE);
  }
  PrefixIndex::Table table = PrefixIndex::BuildTable(snap, 0);
  index.SetCapacity(0, 5);
  index.InstallSnapshot(0, std::move(table));
  EXPECT_EQ(index.num_blocks(0), 5u);
  EXPECT_EQ(index.evictions(0), 3);
  EXPECT_TRUE(index.synced(0));
}

TEST(PrefixIndexTest, AssumedEntriesExpireAndAreForgottenOnFailure) {
  PrefixIndex index;
  const auto chain = Chain(4);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  index.RecordRouted(0, {chain[0], chain[1]}, t0);
  index.RecordRouted(0, {chain[2], chain[3]}, t0 + absl::Seconds(10));
  EXPECT_EQ(index.LongestPrefix(0, chain).device_blocks, 4);
  index.Expire(t0 + PrefixIndex::kRoutedTtl);  // the first two expire
  EXPECT_EQ(index.LongestPrefix(0, chain).total(), 0);
  EXPECT_EQ(index.num_blocks(0), 2u);
  index.ForgetRouted(0, {chain[2], chain[3]});  // their request failed
  EXPECT_EQ(index.num_blocks(0), 0u);

  // Confirmed by the worker's events: no longer assumed, so neither expiry nor a failure of
  // the request drops them.
  index.RecordRouted(1, chain, t0);
  EXPECT_EQ(index.ApplyEvents(1, Batch(3, 1, {chain[0], chain[1]})), PrefixIndex::Apply::kApplied);
  index.ForgetRouted(1, chain);
  index.Expire(t0 + absl::Hours(1));
  EXPECT_EQ(index.LongestPrefix(1, chain).device_blocks, 2);
}

TEST(PrefixIndexTest, ClearingTheDeviceTierDropsAssumedEntries) {
  PrefixIndex index;
  const auto chain = Chain(2);
  EXPECT_EQ(index.ApplyEvents(0, Batch(3, 1, {})), PrefixIndex::Apply::kApplied);
  index.RecordRouted(0, chain);
  pb::KvEventBatch b = Batch(3, 2, {});
  b.add_events()->mutable_all_cleared()->set_medium(pb::MEDIUM_DEVICE);
  EXPECT_EQ(index.ApplyEvents(0, b), PrefixIndex::Apply::kApplied);
  EXPECT_EQ(index.num_blocks(0), 0u);
}

TEST(PrefixIndexTest, AssumedEntriesAreCappedByThePool) {
  PrefixIndex index;
  index.SetCapacity(0, 3);
  const auto chain = Chain(8);
  index.RecordRouted(0, chain);
  EXPECT_EQ(index.num_blocks(0), 3u);
  EXPECT_EQ(index.evictions(0), 5);
  EXPECT_EQ(index.LongestPrefix(0, {chain[5], chain[6], chain[7]}).device_blocks,
            3);  // newest kept
}

// Found by prefix_index_fuzz: a worker that comes back with a smaller pool kept the assumed
// entries of the larger one until the next routing.
TEST(PrefixIndexTest, ASmallerPoolTrimsAssumedEntriesAtOnce) {
  PrefixIndex index;
  index.SetCapacity(0, 8);
  const auto chain = Chain(8);
  index.RecordRouted(0, chain);
  ASSERT_EQ(index.num_blocks(0), 8u);
  index.SetCapacity(0, 2);
  EXPECT_EQ(index.num_blocks(0), 2u);
  EXPECT_EQ(index.evictions(0), 6);
  EXPECT_EQ(index.LongestPrefix(0, {chain[6], chain[7]}).device_blocks, 2);  // newest kept
}

}  // namespace
}  // namespace kvserve::router
