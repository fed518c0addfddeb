// What a router reads from a worker's PUB socket (router/worker_pool.h): messages in the form of
// frames.h (a type, a payload) decoded and applied to the pool and its prefix index, the topic
// following the type as a worker sends it. Nothing may fault; the pool stays usable.
#include <cstddef>
#include <cstdint>
#include <memory>

#include "router/worker_pool.h"
#include "tests/fuzz/frames.h"

namespace {

constexpr const char* kTypes[][2] = {{"status", "WorkerStatus"},
                                     {"kv", "KvEventBatch"},
                                     {"kv", "KvSnapshot"},
                                     {"control", "Control"},
                                     {"kv", "GenerateResponse"}};

struct Pool {
  zmq::context_t ctx;
  kvserve::router::PrefixIndex index;
  std::unique_ptr<kvserve::router::WorkerPool> pool;
};

// One pool for the whole run, its worker at a port nothing listens on (never connected).
Pool& ThePool() {
  static Pool* p = [] {
    auto* q = new Pool;
    q->pool = std::make_unique<kvserve::router::WorkerPool>(q->ctx, &q->index, absl::Seconds(2));
    q->pool->Add({"fuzz", "127.0.0.1", 1, 2});
    return q;
  }();
  return *p;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Pool& p = ThePool();
  for (const kvserve::fuzz::Record& r : kvserve::fuzz::ReadRecords(data, size)) {
    const auto& [topic, type] = kTypes[r.type % std::size(kTypes)];
    p.pool->HandleSub(0, {topic, type, r.payload});
    (void)p.pool->Views();
    (void)p.pool->TakeRecycleAsks();
    (void)p.pool->ExtraKey(0, "salt");
  }
  return 0;
}
