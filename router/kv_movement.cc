#include "router/kv_movement.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "router/router_metrics.h"

namespace kvserve::router {
namespace {

namespace pb = ::kvserve::v1;
using frontend::Job;
using Clock = std::chrono::steady_clock;

}  // namespace

KvMovement::KvMovement(const Options& options, WorkerPool* pool, PrefixIndex* index, Books* books,
                       RoutingPolicy* policy)
    : options_(options), pool_(pool), index_(index), books_(books), policy_(policy) {
  if (options.kv_fetch.links) {
    links_ = std::make_unique<KvLinks>(pool, options.kv_fetch.link_timeout);
    if (options.metrics != nullptr) options.metrics->StartKvLinks();
  }
  fetches_ = std::make_unique<KvFetches>(options.kv_fetch, pool, options.metrics, links_.get());
  if (options.kv_fetch.enabled && options.metrics != nullptr) {
    options.metrics->StartKvFetch(options.kv_fetch.initial_gbps);
  }
}

KvMovement::Wait KvMovement::Start(Job& job, const std::vector<WorkerView>& views,
                                   const std::vector<BlockHash>& hashes, int to) {
  Wait wait;
  wait.prefill = MaybeDisaggregate(job, hashes, to, &wait.prefill_first, &wait.fetch);
  // With a prefill phase, the request is sent once its prefill ended and its worker has the
  // prefill worker's blocks (StartDecodes), or once the blocks streamed; else, with a fetch,
  // once its worker has the peer's blocks.
  if (wait.prefill.empty()) wait.fetch = MaybeFetch(job, views, hashes, to);
  return wait;
}

bool KvMovement::OnMessage(int worker, const ReceivedMessage& m) {
  if (m.type == "KvChunk" || m.type == "KvChunkAck") {
    fetches_->OnMessage(worker, m, Clock::now(), done_);
    return true;
  }
  if (m.type == "KvLinkStatus") {
    pb::KvLinkStatus st;
    if (links_ && ParseMessage(m, &st).ok()) links_->OnStatus(worker, st, Clock::now());
    return true;
  }
  return false;
}

void KvMovement::Refresh(const std::vector<WorkerView>& views) {
  if (!links_) return;
  links_->Refresh(views, Clock::now());
  if (options_.metrics != nullptr) options_.metrics->SetKvLinksReady(links_->ready());
}

uint64_t KvMovement::MaybeFetch(Job& job, const std::vector<WorkerView>& views,
                                const std::vector<BlockHash>& hashes, int to) {
  std::optional<FetchPlan> plan =
      PlanFetch(options_.kv_fetch, fetches_->gbps(), views, *index_, hashes, to);
  if (!plan) return 0;
  const uint64_t fetch = fetches_->Start(job.request, to, *plan, Clock::now());
  if (fetch != 0) {
    const int bs = std::max(1, pool_->status(to)->block_size());
    job.request.set_predicted_cached_tokens((plan->first_block + plan->blocks) * bs);
    VLOG(1) << "request " << job.request.request_id() << ": worker " << to << " fetches "
            << plan->blocks << " blocks from worker " << plan->source << " (about "
            << plan->transfer_s * 1e3 << " ms against " << plan->prefill_s * 1e3
            << " ms of prefill)";
  }
  return fetch;
}

std::vector<KvMovement::Unsent> KvMovement::SendReady(const std::vector<WorkerView>& views) {
  StartDecodes();
  fetches_->Expire(views, Clock::now(), done_);
  std::vector<Unsent> unsent;
  for (const KvFetches::Done& d : done_) {
    Placed* p = books_->Find(d.request_id);
    // Aborted, moved or ended while its fetch ran: nothing to send.
    if (p == nullptr || p->fetch != d.fetch) continue;
    p->fetch = 0;
    p->prefill.clear();  // a streamed phase still running counts for nothing now
    if (!d.status.ok()) {
      VLOG(1) << "request " << d.request_id << ": fetch ended without its blocks (" << d.status
              << "); it prefills them";
      if (const pb::WorkerStatus* st = pool_->status(p->worker); st != nullptr) {
        p->job->request.set_predicted_cached_tokens((d.first_block + d.blocks_added) *
                                                    std::max(1, st->block_size()));
      }
    }
    books_->Number(*pool_, p->worker, p->job->request);
    if (absl::Status s = pool_->Send(p->worker, p->job->request); !s.ok()) {
      unsent.push_back({.request_id = d.request_id, .placed = *p, .why = std::string(s.message())});
      books_->Erase(d.request_id);
    } else {
      p->link_epoch = pool_->link_epoch(p->worker);
    }
  }
  done_.clear();
  return unsent;
}

std::vector<WorkerView> KvMovement::PrefillWorkers(const WorkerView& decode,
                                                   const std::vector<WorkerView>& views) const {
  absl::flat_hash_map<int, Load> load = books_->LoadByWorker(*pool_);
  std::vector<WorkerView> prefill;
  for (WorkerView v : views) {
    if (!v.prefill_only || !v.eligible) continue;
    if (v.kv_wire_block_bytes != decode.kv_wire_block_bytes) {
      LOG_EVERY_N(WARNING, 1000)
          << "prefill worker " << v.name << " moves KV blocks of " << v.kv_wire_block_bytes
          << " bytes and decode worker " << decode.name << " of " << decode.kv_wire_block_bytes
          << ": they are not paired (the same model, KV format, block size and tensor-parallel "
             "size are needed)";
      continue;
    }
    v.active_blocks = load[v.id].blocks;
    v.queued_prefill_tokens = load[v.id].prefill_tokens;
    v.decode_seqs = load[v.id].decode_seqs;
    prefill.push_back(std::move(v));
  }
  return prefill;
}

std::shared_ptr<Job> KvMovement::PrefillPhase(const Job& job, int worker, int predicted_cached) {
  auto phase = std::make_shared<Job>();
  phase->request.set_request_id(absl::StrCat(job.request.request_id(), "#prefill"));
  *phase->request.mutable_prompt_token_ids() = job.request.prompt_token_ids();
  phase->request.set_max_tokens(1);
  phase->request.set_priority(job.request.priority());
  phase->request.set_cache_salt(job.request.cache_salt());
  phase->request.set_predicted_cached_tokens(predicted_cached);
  phase->deadline = job.deadline;
  const std::string request_id = job.request.request_id(), phase_id = phase->request.request_id();
  // The core calls every job back on its thread, which owns this.
  phase->on_response = [this, request_id, phase_id, worker](const pb::GenerateResponse& r) {
    const bool failed = r.finish_reason() == pb::FINISH_REASON_ERROR ||
                        r.finish_reason() == pb::FINISH_REASON_ABORT;
    if (r.has_usage() || failed) {
      // Counted as the phase ends: a streamed request may have gone to its worker already.
      if (options_.metrics != nullptr) {
        options_.metrics->CountDisaggregated(failed ? "prefill_failed" : "prefilled");
      }
      prefilled_.push_back(
          {.request_id = request_id, .prefill_id = phase_id, .worker = worker, .ok = !failed});
    }
  };
  return phase;
}

std::string KvMovement::MaybeDisaggregate(Job& job, const std::vector<BlockHash>& hashes, int to,
                                          int* first_block, uint64_t* stream) {
  if (hashes.empty()) return "";
  std::vector<WorkerView> views = pool_->Views();
  const WorkerView* decode = nullptr;
  for (const WorkerView& v : views) {
    if (v.id == to) decode = &v;
  }
  if (decode == nullptr || decode->kv_wire_block_bytes <= 0) return "";
  *first_block = index_->LongestPrefix(to, hashes).total();
  const int64_t local =
      job.request.prompt_token_ids_size() - static_cast<int64_t>(*first_block) * decode->block_size;
  if (local <= options_.max_local_prefill_tokens) return "";
  const std::vector<WorkerView> prefill = PrefillWorkers(*decode, views);
  if (prefill.empty()) return "";
  absl::StatusOr<Decision> p = Route(
      *policy_, prefill, *index_,
      {.hashes = hashes, .prompt_tokens = job.request.prompt_token_ids_size(), .max_tokens = 1});
  if (!p.ok()) return "";
  std::shared_ptr<Job> phase =
      PrefillPhase(job, p->worker, p->predicted_cached_blocks * decode->block_size);
  const std::string request_id = job.request.request_id(), phase_id = phase->request.request_id();
  // The stream's ask goes first: the prefill worker starts it as the phase arrives.
  *stream = 0;
  const int blocks = static_cast<int>(hashes.size()) - *first_block;
  if (options_.kv_fetch.links && options_.kv_fetch.stream_layers && blocks > 0) {
    *stream = fetches_->Start(job.request, to,
                              {.source = p->worker, .first_block = *first_block, .blocks = blocks},
                              Clock::now(), phase_id);
    if (*stream != 0 && options_.metrics != nullptr) options_.metrics->CountKvLayerStream();
  }
  books_->Number(*pool_, p->worker, phase->request);
  if (!pool_->Send(p->worker, phase->request).ok()) {
    fetches_->Cancel(*stream);
    *stream = 0;
    return "";
  }
  index_->RecordRouted(p->worker, hashes);
  const pb::WorkerStatus* st = pool_->status(p->worker);
  books_->Add(phase_id, Placed{.worker = p->worker,
                               .job = phase,
                               .attempts = kMaxPlacementAttempts,  // it never moves
                               .instance_id = st != nullptr ? st->instance_id() : 0,
                               .hashes = hashes,
                               .link_epoch = pool_->link_epoch(p->worker)});
  // The decode worker will hold every full block once the fetch is done.
  job.request.set_predicted_cached_tokens(static_cast<int>(hashes.size()) * decode->block_size);
  VLOG(1) << "request " << request_id << ": prefill on worker " << p->worker << ", decode on " << to
          << " (" << local << " tokens to prefill" << (*stream != 0 ? ", streamed)" : ")");
  return phase_id;
}

void KvMovement::StartDecodes() {
  std::vector<Prefilled> ended;
  std::swap(ended, prefilled_);
  for (const Prefilled& e : ended) {
    Placed* p = books_->Find(e.request_id);
    // Aborted, moved or ended meanwhile: its prefill phase counts for nothing.
    if (p == nullptr || p->prefill != e.prefill_id) continue;
    p->prefill.clear();
    if (p->fetch != 0) continue;  // its blocks stream: it goes once the stream ended
    const int blocks = static_cast<int>(p->hashes.size()) - p->prefill_first;
    if (e.ok && blocks > 0) {
      const FetchPlan plan{.source = e.worker, .first_block = p->prefill_first, .blocks = blocks};
      p->fetch = fetches_->Start(p->job->request, p->worker, plan, Clock::now());
      if (p->fetch != 0) continue;
    }
    // Nothing to pull: the decode worker prefills what it lacks (KvFetches' fallback path).
    done_.push_back({.request_id = e.request_id,
                     .fetch = 0,
                     .first_block = p->prefill_first,
                     .status = absl::UnavailableError("the prefill phase failed")});
  }
}

}  // namespace kvserve::router
