#include "tools/route_sim/simulator.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <queue>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/kv/block_hash.h"
#include "common/kv/kv_transfer.h"
#include "common/model/hf_config.h"
#include "common/status_macros.h"
#include "kvserve/v1/kvserve.pb.h"
#include "router/policies/factory.h"
#include "router/routing/prefix_index.h"
#include "tools/route_sim/event_buffer.h"
#include "tools/route_sim/greedy_policy.h"
#include "tools/route_sim/router_cost.h"
#include "tools/route_sim/sim_books.h"
#include "worker/engine.h"

namespace kvserve::route_sim {
namespace {

namespace pb = ::kvserve::v1;
using json = nlohmann::json;
using router::WorkerView;

struct SimWorker {
  std::unique_ptr<worker::Engine> engine;
  EventBuffer events;
  bool busy = false;
  // Prompt tokens per second of its steps with two blocks of prompt or more (a moving average,
  // as kvserve-worker measures it for WorkerStatus.prefill_tokens_per_second).
  double prefill_rate = 0;
  std::vector<worker::SequenceOutput> pending;  // the outputs of the step in progress
  double step_started = 0;                      // of the step in progress
  std::vector<std::string> streams;             // the prefill phases streaming from here
  // Per replica, the placement number of its last request this worker took; and the load
  // report the replicas last heard, with what it had seen then.
  std::vector<uint64_t> seen;
  worker::Engine::Load report;
  std::vector<uint64_t> report_seen;
  double report_at = 0;
  // For the report.
  int64_t requests = 0, prompt_tokens = 0, cached_tokens = 0;
};

// One router replica: its index (fed by every worker's events, plus its own placements), its
// policy and its books.
struct Replica {
  explicit Replica(QueueOrder order) : held(order) {}
  uint64_t placements = 0;  // the last placement number it gave
  router::PrefixIndex index;
  std::unique_ptr<router::RoutingPolicy> policy;
  std::vector<Books> books;
  HeldRequests held;  // with SimOptions::router_max_inflight
};

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double rank = p / 100.0 * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank)), hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (rank - static_cast<double>(lo));
}

class Simulation {
 public:
  explicit Simulation(const SimOptions& o) : o_(o) {
    if (o_.router_cost) cost_.emplace();
  }

  absl::Status Init() {
    for (int i = 0; i < o_.replicas; ++i) replicas_.emplace_back(o_.queue_order);
    for (size_t i = 0; i < replicas_.size(); ++i) {
      Replica& r = replicas_[i];
      r.books.resize(o_.workers);
      if (o_.routing.policy == "greedy") {
        r.policy = std::make_unique<GreedyPolicy>(o_.routing.new_fraction,
                                                  [&r](int w) { return r.books[w].active_blocks; });
      } else {
        router::RoutingConfig c = o_.routing;
        c.seed = i + 1;  // the same draws every run
        ASSIGN_OR_RETURN(r.policy, router::MakeRoutingPolicy(c));
      }
    }
    // The longest request a worker takes: the model's, or what its pool holds if less.
    int max_model_len = o_.engine.max_model_len;
    if (max_model_len == 0) {
      ASSIGN_OR_RETURN(ModelConfig model, LoadHfConfig(o_.engine.model_dir));
      max_model_len = static_cast<int>(std::min<int64_t>(
          model.max_position_embeddings, o_.capacity_blocks * o_.engine.cache.block_size));
    }
    workers_.resize(o_.workers);
    for (int w = 0; w < o_.workers; ++w) {
      worker::EngineConfig c = o_.engine;
      c.max_model_len = max_model_len;
      c.backend.device = o_.instant ? worker::Device::kNull : worker::Device::kSim;
      c.backend.sim_sleep = false;
      c.cache.num_blocks = static_cast<int>(o_.capacity_blocks);
      ASSIGN_OR_RETURN(workers_[w].engine, worker::Engine::Create(c));
      workers_[w].seen.assign(o_.replicas, 0);
      workers_[w].report_seen.assign(o_.replicas, 0);
      workers_[w].engine->SetKvEventListener(&workers_[w].events);
      for (Replica& r : replicas_) r.index.SetCapacity(w, static_cast<size_t>(o_.capacity_blocks));
    }
    const worker::Engine& e = *workers_[0].engine;
    block_size_ = e.config().cache.block_size;
    wire_block_bytes_ = e.stats().kv_bytes_per_block * e.config().parallel.tensor_parallel_size;
    num_layers_ = std::max(1, e.model_config().num_layers);
    vocab_size_ = e.model_config().vocab_size;
    ASSIGN_OR_RETURN(extra_key_, (CacheKey{.model_id = e.config().model_id,
                                           .kv_cache_dtype = e.kv_spec().CacheKeyDType(),
                                           .kv_quant = e.kv_spec().CacheKeyQuant(),
                                           .block_size = static_cast<uint32_t>(block_size_)})
                                     .Serialize());
    return absl::OkStatus();
  }

  void Run(const std::vector<trace::TraceRequest>& trace) {
    size_t next = 0;
    double next_report = 0;
    const bool reports = o_.replica_load == SimOptions::ReplicaLoad::kReports;
    while (next < trace.size() || !steps_.empty() || !deferred_.empty() || Holding()) {
      const double arrival =
          next < trace.size() ? ArrivalTime(trace[next]) : std::numeric_limits<double>::infinity();
      if (reports && next_report <= arrival &&
          (steps_.empty() || next_report <= std::get<0>(steps_.top())) &&
          (deferred_.empty() || next_report <= std::get<0>(deferred_.top()))) {
        now_ = next_report;
        std::erase_if(ended_, [&](const Ended& e) { return e.at <= now_; });  // reported now
        for (SimWorker& w : workers_) {  // every worker reports at once (a heartbeat's load)
          w.report = w.engine->load();
          w.report_seen = w.seen;
          w.report_at = now_;
        }
        next_report += o_.report_interval_s;
        PlaceHeld();
        continue;
      }
      if (!deferred_.empty() && std::get<0>(deferred_.top()) <= arrival &&
          (steps_.empty() || std::get<0>(deferred_.top()) <= std::get<0>(steps_.top()))) {
        now_ = std::get<0>(deferred_.top());
        const Pending p = std::get<2>(deferred_.top());
        deferred_.pop();
        Admit(p);
        continue;
      }
      if (!steps_.empty() && std::get<0>(steps_.top()) <= arrival) {
        const auto [t, order, w] = steps_.top();
        steps_.pop();
        now_ = t;
        FinishStep(w);
        PlaceHeld();
        continue;
      }
      now_ = arrival;
      Arrive(trace[next], static_cast<int>(next));
      ++next;
    }
  }

  json Report() const;
  json RouterCpu() const { return cost_ ? cost_->Cpu(now_, o_.replicas) : json(); }

 private:
  double ArrivalTime(const trace::TraceRequest& r) const {
    return static_cast<double>(r.timestamp_ms - o_.window_start_ms) / 1000.0 / o_.speedup;
  }

  // The workers as replica `r` sees them: its own books, every worker's heartbeat; or, with
  // load reports, each worker's report plus r's placements it had not seen.
  std::vector<WorkerView> Views(const Replica& r) const {
    const int replica = static_cast<int>(&r - replicas_.data());
    const bool reports = o_.replica_load == SimOptions::ReplicaLoad::kReports;
    const std::vector<Books> unseen = reports ? Unreported(replica) : std::vector<Books>();
    std::vector<WorkerView> views(workers_.size());
    for (size_t w = 0; w < workers_.size(); ++w) {
      const SimWorker& s = workers_[w];
      const Books& b = r.books[w];
      views[w] = {.id = static_cast<int>(w),
                  .name = absl::StrCat("w", w),
                  .active_blocks = b.active_blocks,
                  .waiting = s.engine->stats().num_waiting,
                  .queued_prefill_tokens = b.queued_prefill,
                  .decode_seqs = b.decode_seqs,
                  .capacity_blocks = o_.capacity_blocks,
                  .block_size = block_size_,
                  .kv_wire_block_bytes = wire_block_bytes_,
                  .prefill_tokens_per_second = s.prefill_rate,
                  .prefill_only = static_cast<int>(w) < o_.prefill_workers};
      if (reports) {
        views[w].active_blocks =
            std::max<int64_t>(0, s.report.reserved_blocks + unseen[w].active_blocks);
        views[w].waiting = s.report.waiting;
        views[w].queued_prefill_tokens =
            std::max<int64_t>(0, s.report.prefill_tokens + unseen[w].queued_prefill);
        views[w].decode_seqs = std::max<int64_t>(0, s.report.decode_seqs + unseen[w].decode_seqs);
      }
      views[w].eligible = !views[w].prefill_only;
      const int64_t requests = reports ? s.report.requests + unseen[w].requests : b.requests;
      if (o_.router_max_inflight > 0 && requests >= o_.router_max_inflight) {
        views[w].eligible = false;
      }
    }
    return views;
  }

  // What replica `r` placed that its worker's last report had not seen, per worker, less what
  // ended since that report still counts (as Books::LoadByWorker).
  std::vector<Books> Unreported(int r) const {
    std::vector<Books> unseen(workers_.size());
    for (const Ended& e : ended_) {
      const Live& l = e.live;
      if (l.replica != r || l.seq > workers_[l.worker].report_seen[r] ||
          e.at < workers_[l.worker].report_at) {
        continue;
      }
      unseen[l.worker].Count(l, -1);
    }
    for (const auto& [id, l] : live_) {
      if (l.replica != r || (l.seq != 0 && l.seq <= workers_[l.worker].report_seen[r])) continue;
      unseen[l.worker].Count(l, 1);
    }
    return unseen;
  }

  void Arrive(const trace::TraceRequest& r, int index) {
    // Ids in [100, vocab), as kvserve-bench serve --dataset trace --vocab-size V makes them.
    HeldRequest h{.index = index, .arrival = now_};
    h.prompt = trace::TracePrompt(r, {.block_size = o_.trace_block_size, .max_token = vocab_size_});
    h.max_tokens = std::max<int64_t>(
        1, o_.max_output > 0 ? std::min(o_.max_output, r.output_length) : r.output_length);
    const std::vector<uint32_t> ids(h.prompt.begin(), h.prompt.end());
    h.hashes = HashFullBlocks(ids, block_size_, extra_key_);
    // A load balancer in front of the replicas: each in turn.
    Replica& rep = replicas_[index % o_.replicas];
    const bool limited = o_.router_max_inflight > 0;
    if (limited && !rep.held.empty()) return Hold(rep, std::move(h));
    const std::vector<WorkerView> views = Views(rep);
    if (limited && !AnyEligible(views)) return Hold(rep, std::move(h));
    Route(rep, h, views);
  }

  // Replica `rep` holds request `h` (every worker is at its limit, or others wait before it).
  void Hold(Replica& rep, HeldRequest h) {
    int cached = 0;
    for (int w = 0; w < o_.workers; ++w) {
      cached = std::max(cached, rep.index.LongestPrefix(w, h.hashes).total());
    }
    h.uncached_tokens = static_cast<int64_t>(h.prompt.size()) - int64_t{cached} * block_size_;
    rep.held.Push(std::move(h));
    ++held_;
  }
  static bool AnyEligible(const std::vector<WorkerView>& views) {
    return std::any_of(views.begin(), views.end(), [](const WorkerView& v) { return v.eligible; });
  }
  bool Holding() const {
    return std::any_of(replicas_.begin(), replicas_.end(),
                       [](const Replica& r) { return !r.held.empty(); });
  }
  // Each replica places what it holds while it has room (its requests ended, or reports came).
  void PlaceHeld() {
    for (Replica& rep : replicas_) {
      while (!rep.held.empty()) {
        const std::vector<WorkerView> views = Views(rep);
        if (!AnyEligible(views)) break;
        HeldRequest h = rep.held.Pop();
        held_wait_.push_back(now_ - h.arrival);
        Route(rep, h, views);
      }
    }
  }

  // Routes request `h` on replica `rep`, whose workers are `views` now, and sends it to its
  // worker.
  void Route(Replica& rep, const HeldRequest& h, const std::vector<WorkerView>& views) {
    const std::vector<int32_t>& prompt = h.prompt;
    const std::vector<BlockHash>& hashes = h.hashes;
    const int64_t out = h.max_tokens;
    const int index = h.index;
    const int replica = static_cast<int>(&rep - replicas_.data());
    const absl::Time t = absl::UnixEpoch() + absl::Seconds(now_);
    rep.index.Expire(t);
    absl::StatusOr<router::Decision> d =
        Place(rep, views,
              {.hashes = hashes,
               .prompt_tokens = static_cast<int64_t>(prompt.size()),
               .max_tokens = out,
               // As Books::OthersPlacing finds it from the reports: every replica places.
               .other_replicas =
                   o_.replicas > 1 && o_.replica_load == SimOptions::ReplicaLoad::kReports});
    if (!d.ok()) {
      ++errors_[std::string(d.status().message())];
      return;
    }
    ++decisions_[std::string(router::RouteReasonName(d->reason))];
    const std::string id = absl::StrCat("r", index);
    Live l{.worker = d->worker,
           .replica = replica,
           .arrival = h.arrival,
           .prompt_tokens = static_cast<int64_t>(prompt.size()),
           .predicted_cached = int64_t{d->predicted_cached_blocks} * block_size_,
           .blocks = (static_cast<int64_t>(prompt.size()) + out + block_size_ - 1) / block_size_};
    Pending p{.id = id, .prompt = prompt, .hashes = hashes, .max_tokens = static_cast<int>(out)};
    double delay = 0;
    std::optional<Pending> phase = MaybeDisaggregate(rep, views, p, l, d->worker, t);
    if (std::optional<router::FetchPlan> plan =
            phase ? std::nullopt
                  : router::PlanFetch(o_.fetch, o_.fetch.initial_gbps, views, rep.index, hashes,
                                      d->worker)) {
      // The source sends what it holds now; the request reaches its worker once that arrived.
      p.fetch_first = plan->first_block;
      p.fetch_blocks = std::min(
          plan->blocks, workers_[plan->source].engine->CachedRun(hashes, plan->first_block));
      ++fetches_;
      if (p.fetch_blocks == 0) ++fetch_fallbacks_["evicted"];
      delay = LinkSeconds(p.fetch_blocks, o_.fetch.initial_gbps);
      fetch_seconds_ += delay;
      l.predicted_cached = int64_t{plan->first_block + p.fetch_blocks} * block_size_;
    }
    rep.index.RecordRouted(d->worker, hashes, t);
    rep.books[d->worker].Count(l, 1);
    live_[id] = l;
    if (phase) {
      // Admitted once the phase ended (PrefillEnded), or its stream did.
      StartStream(*phase, p);
      after_prefill_[phase->id] = std::move(p);
      Admit(*phase);
    } else if (delay > 0) {
      deferred_.emplace(now_ + delay, order_++, std::move(p));
    } else {
      Admit(p);
    }
  }

  // A routed request reaches its worker (after its fetch, if any).
  struct Pending {
    std::string id;
    std::vector<int32_t> prompt;
    std::vector<BlockHash> hashes;
    int max_tokens = 0;
    int fetch_first = 0, fetch_blocks = 0;  // a fetch's blocks, adopted before the request
    // Layer streaming, for a request waiting for its phase: the blocks from fetch_first the
    // prefill worker cached when last seen, those sent, and when its link is free.
    int seen_run = 0, streamed_blocks = 0;
    double link_free = 0;
  };

  // As the router's MaybeDisaggregate: when request `p` (`l` on the books, routed to decode
  // worker `to`) would prefill more than max_local_prefill_tokens there, places its prefill
  // phase on the prefill worker the policy picks and returns the phase, to admit once `p`
  // waits for it; `p` then starts its fetch at the first block `to` lacks. None: the request
  // goes on as it is.
  std::optional<Pending> MaybeDisaggregate(Replica& rep, const std::vector<WorkerView>& views,
                                           Pending& p, Live& l, int to, absl::Time t) {
    if (o_.prefill_workers == 0 || p.hashes.empty()) return std::nullopt;
    const int first = rep.index.LongestPrefix(to, p.hashes).total();
    if (l.prompt_tokens - int64_t{first} * block_size_ <= o_.max_local_prefill_tokens) {
      return std::nullopt;
    }
    std::vector<WorkerView> prefill;
    for (WorkerView v : views) {
      if (!v.prefill_only) continue;
      v.eligible = true;
      prefill.push_back(std::move(v));
    }
    absl::StatusOr<router::Decision> d =
        router::Route(*rep.policy, prefill, rep.index,
                      {.hashes = p.hashes, .prompt_tokens = l.prompt_tokens, .max_tokens = 1});
    if (!d.ok()) return std::nullopt;
    const std::string id = absl::StrCat(p.id, "#prefill");
    Live phase{.worker = d->worker,
               .replica = l.replica,
               .arrival = now_,
               .prompt_tokens = l.prompt_tokens,
               .predicted_cached = int64_t{d->predicted_cached_blocks} * block_size_,
               .blocks = l.prompt_tokens / block_size_ + 1,
               .prefill_phase = true};
    rep.index.RecordRouted(d->worker, p.hashes, t);
    rep.books[d->worker].Count(phase, 1);
    live_[id] = phase;
    p.fetch_first = first;
    l.disaggregated = true;
    l.predicted_cached = static_cast<int64_t>(p.hashes.size()) * block_size_;
    ++disaggregated_;
    return Pending{.id = id, .prompt = p.prompt, .hashes = p.hashes, .max_tokens = 1};
  }

  // With layer streaming: request `p` waits for `phase`, whose worker sends its blocks from
  // p.fetch_first as its steps compute them (AdvanceStreams).
  void StartStream(const Pending& phase, Pending& p) {
    if (!o_.disagg_stream_layers) return;
    SimWorker& s = workers_[live_.at(phase.id).worker];
    p.seen_run = s.engine->CachedRun(p.hashes, p.fetch_first);
    s.streams.push_back(phase.id);
  }

  // A step of worker `w` ended: each phase streaming from it whose prompt's cached run the step
  // lengthened (so the phase ran in it) sends what of the run it has not.
  void AdvanceStreams(int w) {
    SimWorker& s = workers_[w];
    std::erase_if(s.streams, [&](const std::string& phase_id) {
      auto it = after_prefill_.find(phase_id);
      if (it == after_prefill_.end()) return true;  // dropped
      Pending& p = it->second;
      if (const int run = s.engine->CachedRun(p.hashes, p.fetch_first); run > p.seen_run) {
        SendStep(s, p, run);
      }
      return false;
    });
  }

  // The step of `s` that just ended sends what of p's cached run (`run` blocks from
  // p.fetch_first) it has not sent. Layer l of them leaves once the step computed it (layers
  // spread evenly over the step), the link taking them one after the other.
  void SendStep(const SimWorker& s, Pending& p, int run) {
    const int lacking = static_cast<int>(p.hashes.size()) - p.fetch_first;
    const int blocks = std::min(run, lacking) - p.streamed_blocks;
    p.seen_run = std::max(p.seen_run, run);
    if (blocks <= 0) return;
    const double link = LinkSeconds(blocks, o_.disagg_gbps), layers = num_layers_;
    const double begin = std::max(p.link_free, s.step_started + (now_ - s.step_started) / layers);
    p.link_free = std::max(begin + link, now_ + link / layers);
    p.streamed_blocks += blocks;
  }

  // The time `blocks` blocks take on a link of `gbps`.
  double LinkSeconds(int blocks, double gbps) const {
    return static_cast<double>(blocks) * static_cast<double>(wire_block_bytes_) / (gbps * 1e9);
  }

  // A prefill phase ended on worker `w`: its request reaches its decode worker once the blocks
  // the prefill worker holds have crossed the link.
  void PrefillEnded(const std::string& phase_id, int w) {
    auto it = after_prefill_.find(phase_id);
    if (it == after_prefill_.end()) return;
    Pending p = std::move(it->second);
    after_prefill_.erase(it);
    const int lacking = static_cast<int>(p.hashes.size()) - p.fetch_first;
    const int run = workers_[w].engine->CachedRun(p.hashes, p.fetch_first);
    if (o_.disagg_stream_layers) {
      std::erase(workers_[w].streams, phase_id);
      SendStep(workers_[w], p, run);  // its last step sends the rest (all, on a whole prefix hit)
      p.fetch_blocks = p.streamed_blocks;  // what the phase's steps sent, held until sent
    } else {
      p.fetch_blocks = std::min(lacking, run);
    }
    if (p.fetch_blocks < lacking) ++fetch_fallbacks_["evicted"];
    const double link = LinkSeconds(p.fetch_blocks, o_.disagg_gbps);
    const double arrives = o_.disagg_stream_layers ? std::max(now_, p.link_free) : now_ + link;
    fetch_seconds_ += link;
    exposed_fetch_seconds_ += arrives - now_;
    deferred_.emplace(arrives, order_++, std::move(p));
  }
  void Admit(const Pending& p) {
    auto it = live_.find(p.id);
    if (it == live_.end()) return;
    const int target = it->second.worker;
    SimWorker& w = workers_[target];
    if (p.fetch_blocks > 0) {
      absl::StatusOr<int> added =
          w.engine->AdoptPrefix(p.prompt, "", p.fetch_first, p.fetch_blocks);
      if (added.ok()) {
        fetched_blocks_ += *added;
      } else {
        ++fetch_fallbacks_[std::string(KvTransferFailureReason(added.status().code()))];
      }
    }
    worker::RequestInput in{.request_id = p.id,
                            .prompt = p.prompt,
                            .max_tokens = p.max_tokens,
                            .predicted_cached_tokens = static_cast<int>(
                                std::min<int64_t>(it->second.predicted_cached, p.prompt.size()))};
    in.sampling.ignore_eos = true;
    if (absl::Status s = w.engine->AddRequest(std::move(in)); !s.ok()) {
      ++errors_[std::string(s.message().substr(0, 80))];
      replicas_[it->second.replica].index.ForgetRouted(target, p.hashes);
      Drop(p.id);
      return;
    }
    Live& l = it->second;  // the worker has it: its next report counts it
    l.seq = ++replicas_[l.replica].placements;
    w.seen[l.replica] = l.seq;
    ++w.requests;
    if (!it->second.disaggregated) w.prompt_tokens += it->second.prompt_tokens;
    if (!w.busy) StartStep(target);
  }

  void StartStep(int w) {
    SimWorker& s = workers_[w];
    if (!s.engine->HasWork()) return;
    const worker::EngineStats before = s.engine->stats();
    absl::StatusOr<std::vector<worker::SequenceOutput>> outs = s.engine->Step();
    const worker::EngineStats after = s.engine->stats();
    if (!outs.ok()) {
      ++errors_[absl::StrCat("engine: ", outs.status().message())];
      return;
    }
    if (outs->empty() && after.computed_tokens == before.computed_tokens &&
        after.sim_busy_seconds == before.sim_busy_seconds) {
      // Nothing could be scheduled and nothing runs: the waiting requests never fit the pool.
      for (const std::string& id : s.engine->AbortAll()) {
        ++errors_["does not fit the worker's KV pool"];
        Drop(id);
      }
      return;
    }
    s.pending = *std::move(outs);
    s.busy = true;
    s.step_started = now_;
    const double took = after.sim_busy_seconds - before.sim_busy_seconds;
    if (const int64_t prompt = after.computed_prompt_tokens - before.computed_prompt_tokens;
        prompt >= 32 && took > 0) {
      const double rate = static_cast<double>(prompt) / took;
      s.prefill_rate = s.prefill_rate == 0 ? rate : 0.8 * s.prefill_rate + 0.2 * rate;
    }
    steps_.emplace(now_ + took, order_++, w);
  }

  // The replica's routing policy's decision (with --router-cost, timed, and the index's size
  // seen first).
  absl::StatusOr<router::Decision> Place(Replica& rep, const std::vector<WorkerView>& views,
                                         router::RouteRequest request) {
    std::optional<RouterCost::Timer> timer;
    if (cost_) {
      int64_t entries = 0;
      for (size_t w = 0; w < workers_.size(); ++w) {
        entries += static_cast<int64_t>(replicas_[0].index.num_blocks(static_cast<int>(w)));
      }
      cost_->SeeEntries(entries);
      ++cost_->placements;
      timer.emplace(cost_->placing_s);
    }
    request.fetch_offers =
        router::FetchOffers(o_.fetch, o_.fetch.initial_gbps, views, rep.index, request.hashes);
    return router::Route(*rep.policy, views, rep.index, request);
  }

  // Every replica subscribes to every worker's events (with --router-cost, each parses the
  // batch off the wire, as a router does).
  void TakeEvents(int w, const pb::KvEventBatch& batch) {
    const auto apply = [&](size_t r, const pb::KvEventBatch& b) {
      if (replicas_[r].index.ApplyEvents(w, b) == router::PrefixIndex::Apply::kGap) ++event_gaps_;
    };
    if (cost_) return cost_->TakeBatch(batch, replicas_.size(), apply);
    for (size_t r = 0; r < replicas_.size(); ++r) apply(r, batch);
  }

  void FinishStep(int w) {
    SimWorker& s = workers_[w];
    s.busy = false;
    AdvanceStreams(w);
    if (std::optional<pb::KvEventBatch> batch = s.events.Take(w + 1)) TakeEvents(w, *batch);
    for (const worker::SequenceOutput& out : s.pending) {
      auto it = live_.find(out.request_id);
      if (it == live_.end()) continue;
      Live& l = it->second;
      if (!l.started && !out.new_tokens.empty()) {
        l.started = true;
        l.first_token_at = now_;
        if (!l.prefill_phase) ttft_.push_back(now_ - l.arrival);
        if (l.disaggregated) disaggregated_ttft_.push_back(now_ - l.arrival);
        if (!l.disaggregated) s.cached_tokens += out.num_cached_prompt_tokens;
        Books& b = replicas_[l.replica].books[w];
        b.queued_prefill -= l.prompt_tokens - l.predicted_cached;
        ++b.decode_seqs;
      }
      l.output_tokens += static_cast<int64_t>(out.new_tokens.size());
      if (out.request_finished) {
        if (l.prefill_phase) {
          const std::string id = out.request_id;
          Forget(id);
          PrefillEnded(id, w);
          continue;
        }
        e2e_.push_back(now_ - l.arrival);
        if (l.output_tokens > 1) {
          tpot_.push_back((now_ - l.first_token_at) / static_cast<double>(l.output_tokens - 1));
        }
        Forget(out.request_id);
      }
    }
    s.pending.clear();
    StartStep(w);
  }

  // A request that failed: off the books, with the request its prefill phase was for.
  void Drop(const std::string& id) {
    Forget(id);
    if (auto it = after_prefill_.find(id); it != after_prefill_.end()) {
      Forget(it->second.id);
      after_prefill_.erase(it);
    }
  }

  // Takes a request off the books of its worker.
  void Forget(const std::string& id) {
    auto it = live_.find(id);
    if (it == live_.end()) return;
    const Live& l = it->second;
    replicas_[l.replica].books[l.worker].Count(l, -1);
    // Its worker's last report may still count it (Books::Erase's Ended).
    if (l.seq != 0) ended_.push_back({.id = id, .live = l, .at = now_});
    live_.erase(it);
  }

  const SimOptions o_;
  // Requests that ended since their worker's last report, which still counts them.
  struct Ended {
    std::string id;
    Live live;
    double at = 0;
  };
  std::vector<Ended> ended_;
  std::vector<SimWorker> workers_;
  std::vector<Replica> replicas_;
  int block_size_ = 16;
  int32_t vocab_size_ = 0;
  std::string extra_key_;
  double now_ = 0;
  uint64_t order_ = 0;
  // (end time, order, worker) of the steps in progress, earliest first.
  std::priority_queue<std::tuple<double, uint64_t, int>,
                      std::vector<std::tuple<double, uint64_t, int>>, std::greater<>>
      steps_;
  // (arrival time, order, request) of requests waiting for their fetch, earliest first.
  struct Later {
    bool operator()(const std::tuple<double, uint64_t, Pending>& a,
                    const std::tuple<double, uint64_t, Pending>& b) const {
      return std::tie(std::get<0>(a), std::get<1>(a)) > std::tie(std::get<0>(b), std::get<1>(b));
    }
  };
  std::priority_queue<std::tuple<double, uint64_t, Pending>,
                      std::vector<std::tuple<double, uint64_t, Pending>>, Later>
      deferred_;
  int64_t wire_block_bytes_ = 0;
  int num_layers_ = 1;
  int64_t fetches_ = 0, fetched_blocks_ = 0;
  // The link time of the fetches and phases' transfers; of the phases', what the decode worker
  // waited for once the phase had ended.
  double fetch_seconds_ = 0, exposed_fetch_seconds_ = 0;
  std::map<std::string, int64_t> fetch_fallbacks_;
  absl::flat_hash_map<std::string, Live> live_;
  // Disaggregated requests waiting for their prefill phase, by the phase's id.
  absl::flat_hash_map<std::string, Pending> after_prefill_;
  int64_t disaggregated_ = 0;
  std::vector<double> ttft_, e2e_, tpot_, disaggregated_ttft_;
  std::map<std::string, int64_t> decisions_, errors_;
  int64_t event_gaps_ = 0;
  // Requests the replicas held (SimOptions::router_max_inflight), and how long each waited.
  int64_t held_ = 0;
  std::vector<double> held_wait_;
  std::optional<RouterCost> cost_;  // with SimOptions::router_cost
};

json Simulation::Report() const {
  json r;
  int64_t prompt = 0, cached = 0, min_req = INT64_MAX, max_req = 0, min_tok = INT64_MAX,
          max_tok = 0;
  double busy = 0;
  json per_worker = json::array();
  for (const SimWorker& s : workers_) {
    prompt += s.prompt_tokens;
    cached += s.cached_tokens;
    min_req = std::min(min_req, s.requests), max_req = std::max(max_req, s.requests);
    min_tok = std::min(min_tok, s.prompt_tokens), max_tok = std::max(max_tok, s.prompt_tokens);
    const worker::EngineStats st = s.engine->stats();
    busy += st.sim_busy_seconds;
    per_worker.push_back({{"requests", s.requests},
                          {"prompt_tokens", s.prompt_tokens},
                          {"busy_s", st.sim_busy_seconds},
                          {"preemptions", st.preemptions},
                          {"evictions", st.evictions}});
  }
  r["requests"] = static_cast<int64_t>(e2e_.size());
  int64_t errors = 0;
  for (const auto& [why, n] : errors_) errors += n;
  r["errors"] = errors;
  r["error_reasons"] = errors_;
  r["hit_rate"] = prompt > 0 ? static_cast<double>(cached) / static_cast<double>(prompt) : 0.0;
  r["requests_per_worker_min"] = min_req;
  r["requests_per_worker_max"] = max_req;
  r["prompt_tokens_per_worker_min"] = min_tok;
  r["prompt_tokens_per_worker_max"] = max_tok;
  r["decisions"] = decisions_;
  r["event_gaps"] = event_gaps_;
  r["fetches"] = fetches_;
  r["fetched_blocks"] = fetched_blocks_;
  r["fetch_seconds"] = fetch_seconds_;
  r["exposed_fetch_seconds"] = exposed_fetch_seconds_;
  r["fetch_fallbacks"] = fetch_fallbacks_;
  r["disaggregated"] = disaggregated_;
  r["virtual_seconds"] = now_;
  r["utilization"] = now_ > 0 ? busy / (now_ * static_cast<double>(workers_.size())) : 0.0;
  for (const auto& [name, v] :
       {std::pair{"ttft", &ttft_}, std::pair{"e2e", &e2e_}, std::pair{"tpot", &tpot_},
        std::pair{"disaggregated_ttft", &disaggregated_ttft_}}) {
    r[absl::StrCat("p50_", name, "_ms")] = 1e3 * Percentile(*v, 50);
    r[absl::StrCat("p90_", name, "_ms")] = 1e3 * Percentile(*v, 90);
    r[absl::StrCat("p99_", name, "_ms")] = 1e3 * Percentile(*v, 99);
  }
  if (o_.router_max_inflight > 0) {
    size_t depth = 0;
    for (const Replica& rep : replicas_) depth = std::max(depth, rep.held.max_depth());
    r["router_queue"] = {{"held", held_},
                         {"max_depth", depth},
                         {"p50_wait_ms", 1e3 * Percentile(held_wait_, 50)},
                         {"p99_wait_ms", 1e3 * Percentile(held_wait_, 99)}};
  }
  if (cost_) r["router_cost"] = cost_->Counts(now_);
  r["workers"] = per_worker;
  return r;
}

}  // namespace

absl::StatusOr<SimReport> Simulate(const std::vector<trace::TraceRequest>& trace,
                                   const SimOptions& options) {
  if (options.workers < 1) return absl::InvalidArgumentError("--workers must be >= 1");
  if (options.replicas < 1) return absl::InvalidArgumentError("--replicas must be >= 1");
  if (!(options.report_interval_s > 0)) {
    return absl::InvalidArgumentError("--report-interval-ms must be > 0");
  }
  if (options.capacity_blocks < 1) {
    return absl::InvalidArgumentError("each worker's KV pool must hold at least one block");
  }
  if (!(options.speedup > 0)) return absl::InvalidArgumentError("--speedup must be > 0");
  if (options.router_max_inflight < 0) {
    return absl::InvalidArgumentError("--router-max-inflight-per-worker must be >= 0");
  }
  if (options.prefill_workers < 0 || options.prefill_workers >= options.workers) {
    return absl::InvalidArgumentError(
        "--prefill-workers must leave at least one of --workers to decode");
  }
  if (options.prefill_workers > 0 && !(options.disagg_gbps > 0)) {
    return absl::InvalidArgumentError("--disagg-gbps must be > 0");
  }
  Simulation sim(options);
  RETURN_IF_ERROR(sim.Init());
  sim.Run(trace::Window(trace, options.window_start_ms, options.window_end_ms));
  return SimReport{.json = sim.Report(), .router_cpu = sim.RouterCpu()};
}

}  // namespace kvserve::route_sim
