// The router's books: every request the core placed and has not seen end, and what each worker
// holds by them. Routing reads load from here, not from heartbeats, which lag (250 ms): a worker
// that just finished a request would look busy.
//
// Not thread-safe: RouterCore owns its Books on the core thread, as it does its other parts.
//
//   books.Add(id, {.worker = w, .job = job, .hashes = hashes});
//   if (Placed* p = books.Find(id)) p->started = true;
//   for (auto& [id, p] : books.TakeIf([&](const Placed& p) { return p.worker == gone; })) ...
#ifndef KVSERVE_ROUTER_BOOKS_H_
#define KVSERVE_ROUTER_BOOKS_H_

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "common/kv/block_hash.h"
#include "frontend/core/core.h"
#include "router/worker_pool.h"

namespace kvserve::router {

// Requests whose worker went away (or drained) before anything streamed are placed again, on
// another worker, up to this many placements in all.
inline constexpr int kMaxPlacementAttempts = 3;

// A placed request.
struct Placed {
  int worker;
  std::shared_ptr<frontend::Job> job;
  bool started = false;  // a response arrived: the request can no longer move
  int attempts = 1;
  uint64_t instance_id = 0;       // the worker process it went to (0: not known yet)
  std::vector<BlockHash> hashes;  // its prompt's blocks, recorded in the index as assumed
  uint32_t next_seq = 1;          // the GenerateResponse.seq its next reply must have
  int link_epoch = 0;  // the framed link it was sent on (WorkerPool::link_epoch; 0: ZeroMQ)
  // Not sent yet: its worker is pulling its prefix from a peer (KvFetches' number; 0: none).
  uint64_t fetch = 0;
  // Not sent yet: a prefill worker is computing its KV under this request id (empty: none),
  // after which its worker pulls blocks from prefill_first on (router/kv_movement.h).
  std::string prefill;
  int prefill_first = 0;

  // Whether it may be placed again: nothing of it streamed and it has placements left.
  [[nodiscard]] bool movable() const { return !started && attempts < kMaxPlacementAttempts; }
};

// What in-flight requests hold of a worker. `blocks`, `prefill_tokens` and `decode_seqs` are
// every replica's: the worker's last load report (WorkerStatus.load_report) plus this replica's
// placements it had not seen; from a worker that sends no report, this replica's alone.
// `requests` and `sequences` are this replica's own (its in-flight limit).
struct Load {
  int64_t blocks = 0;
  int requests = 0;
  int sequences = 0;           // a request of n samples runs n
  int64_t prefill_tokens = 0;  // prompt tokens not started requests have yet to prefill
  int64_t decode_seqs = 0;     // sequences of started requests
};

class Books {
 public:
  // `router_id`: this replica's, unique per process (the workers' reports say, per id, the last
  // placement they took).
  explicit Books(std::string router_id) : router_id_(std::move(router_id)) {}

  // Numbers `request` as this replica's next placement (router_id, placement), just before it is
  // sent to `worker`; a request taken back for another placement is numbered again when sent
  // again. Only for a worker that sends load reports: an older one refuses fields it does not
  // know.
  void Number(const WorkerPool& pool, int worker, kvserve::v1::GenerateRequest& request);
  // The request's entry, or null when it is not on the books (waiting, ended or never placed).
  [[nodiscard]] Placed* Find(const std::string& request_id);
  void Add(const std::string& request_id, Placed placed);
  // Takes a request off the books (it ended, failed or was never sent). A numbered one is kept
  // a second as ended: until its worker's next report, the last one still counts it.
  void Erase(const std::string& request_id);
  // Takes off the books every request `take` selects, and returns them (in no order).
  std::vector<std::pair<std::string, Placed>> TakeIf(absl::FunctionRef<bool(const Placed&)> take);
  // What each worker's requests will hold (Load): the blocks of prompt and output (at the block
  // size of its heartbeat; 16 before the first), requests, sequences, prefill still to do.
  [[nodiscard]] absl::flat_hash_map<int, Load> LoadByWorker(const WorkerPool& pool) const;
  // Whether another replica placed on any worker in the last kOthersWindow, as the workers'
  // load reports say (LoadReport.seen); looked up again at most every 100 ms.
  static constexpr std::chrono::seconds kOthersWindow{10};
  bool OthersPlacing(const WorkerPool& pool, std::chrono::steady_clock::time_point now);
  [[nodiscard]] size_t size() const { return placed_.size(); }

 private:
  std::string router_id_;
  uint64_t placements_ = 0;  // the last number given
  // Numbered requests that ended lately, which their worker's last report may still count.
  struct Ended {
    int worker;
    uint64_t placement;
    std::chrono::steady_clock::time_point at;
    int64_t tokens;  // prompt + max_tokens
    int n;
    int64_t prefill_tokens;  // 0 once started
    bool started;
  };
  std::deque<Ended> ended_;
  bool others_placing_ = false;
  std::chrono::steady_clock::time_point others_checked_;
  absl::flat_hash_map<std::string, Placed> placed_;
};

}  // namespace kvserve::router

#endif  // KVSERVE_ROUTER_BOOKS_H_
