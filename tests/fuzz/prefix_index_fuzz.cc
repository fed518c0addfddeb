// The router's prefix index (router/routing/prefix_index.h) under arbitrary KV-event batches,
// snapshots, heartbeats and routing from a few workers: whatever arrives, a worker's confirmed
// entries stay within the pool it reported, and lookups never fault.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "router/routing/prefix_index.h"

namespace pb = ::kvserve::v1;
using kvserve::BlockHash;
using kvserve::router::PrefixIndex;

namespace {

// Hashes from a small space, so that events and lookups meet.
BlockHash Hash(FuzzedDataProvider& in) {
  return BlockHash{in.ConsumeIntegralInRange<uint64_t>(0, 31), 0};
}

std::string HashBytes(FuzzedDataProvider& in) {
  if (in.ConsumeIntegralInRange<int>(0, 15) == 0) return in.ConsumeRandomLengthString(40);
  return Hash(in).ToBytes();
}

pb::Medium Medium(FuzzedDataProvider& in) {
  return static_cast<pb::Medium>(in.ConsumeIntegralInRange<int>(0, 3));
}

template <typename Change>
void FillChange(FuzzedDataProvider& in, Change* c) {
  for (int k = in.ConsumeIntegralInRange<int>(0, 6); k > 0; --k) c->add_block_hashes(HashBytes(in));
  c->set_medium(Medium(in));
}

pb::KvEventBatch Batch(FuzzedDataProvider& in, uint64_t seq) {
  pb::KvEventBatch b;
  b.set_seq(in.ConsumeBool() ? seq : in.ConsumeIntegral<uint64_t>() % 8);
  for (int e = in.ConsumeIntegralInRange<int>(0, 4); e > 0; --e) {
    pb::KvEvent* ev = b.add_events();
    switch (in.ConsumeIntegralInRange<int>(0, 2)) {
      case 0:
        FillChange(in, ev->mutable_stored());
        break;
      case 1:
        FillChange(in, ev->mutable_removed());
        break;
      default:
        ev->mutable_all_cleared()->set_medium(Medium(in));
    }
  }
  return b;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  PrefixIndex index;
  size_t capacity[3] = {0, 0, 0};
  absl::Time now = absl::UnixEpoch();
  while (in.remaining_bytes() > 0) {
    const int w = in.ConsumeIntegralInRange<int>(0, 2);
    switch (in.ConsumeIntegralInRange<int>(0, 8)) {
      case 0:
        index.ApplyEvents(w, Batch(in, index.last_seq(w) + 1));
        break;
      case 1: {
        pb::KvSnapshot s;
        s.set_seq(in.ConsumeIntegralInRange<uint64_t>(0, 16));
        for (int k = in.ConsumeIntegralInRange<int>(0, 40); k > 0; --k) {
          pb::CachedBlock* c = s.add_blocks();
          c->set_block_hash(HashBytes(in));
          c->set_medium(Medium(in));
        }
        index.ApplySnapshot(w, s);
        break;
      }
      case 2:
        index.SeeInstance(w, in.ConsumeIntegralInRange<uint64_t>(0, 3));
        break;
      case 3:
      case 4: {
        std::vector<BlockHash> hashes(in.ConsumeIntegralInRange<int>(0, 8));
        for (BlockHash& h : hashes) h = Hash(in);
        if (in.ConsumeBool()) {
          index.RecordRouted(w, hashes, now);
        } else if (in.ConsumeBool()) {
          index.ForgetRouted(w, hashes);
        } else {
          const PrefixIndex::Match m = index.LongestPrefix(w, hashes);
          if (m.total() > static_cast<int>(hashes.size())) abort();
        }
        break;
      }
      case 5:
        now += absl::Seconds(in.ConsumeIntegralInRange<int>(0, 40));
        index.Expire(now);
        break;
      case 6:
        capacity[w] = in.ConsumeIntegralInRange<size_t>(0, 24);
        index.SetCapacity(w, capacity[w]);
        break;
      case 7:
        index.RemoveWorker(w);
        capacity[w] = 0;
        break;
      default:
        (void)index.synced(w);
        (void)index.evictions(w);
    }
    // Confirmed plus assumed entries: the assumed ones are capped at the pool size too.
    if (capacity[w] > 0 && index.num_blocks(w) > 2 * capacity[w]) abort();
  }
  return 0;
}
