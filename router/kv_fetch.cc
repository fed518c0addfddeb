#include "router/kv_fetch.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/kv/kv_transfer.h"
#include "router/router_metrics.h"

namespace kvserve::router {
namespace {

namespace pb = ::kvserve::v1;

const WorkerView* FindView(absl::Span<const WorkerView> views, int id) {
  for (const WorkerView& v : views) {
    if (v.id == id) return &v;
  }
  return nullptr;
}

// Failures a second attempt cannot mend: another prompt, salt, format or TP size; no room at
// the target; a device that moves no KV; a source that no longer caches the blocks.
bool Retryable(absl::StatusCode code) {
  return code != absl::StatusCode::kFailedPrecondition &&
         code != absl::StatusCode::kResourceExhausted && code != absl::StatusCode::kUnimplemented &&
         code != absl::StatusCode::kNotFound;
}

absl::Status FromWire(const pb::Error& e) {
  return {static_cast<absl::StatusCode>(e.code()), e.message()};
}

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

uint64_t KvFetches::Start(const pb::GenerateRequest& request, int to, const FetchPlan& plan,
                          Clock::time_point now, const std::string& stream_request_id) {
  const uint64_t id = next_id_++;
  Fetch f;
  f.request_id = request.request_id();
  f.source = plan.source;
  f.target = to;
  f.planned_blocks = plan.blocks;
  f.first_block = plan.first_block;
  // The attempt's time: the configured floor, plus twice the transfer's estimate.
  f.budget = config_.timeout + absl::Seconds(2 * plan.transfer_s);
  if (!stream_request_id.empty()) {
    // It waits for the prefill, queued at the source behind others: the link's bound.
    if (links_ == nullptr) return 0;
    f.streamed = true;
    f.budget = std::max(f.budget, config_.link_timeout);
    f.ask.set_stream_request_id(stream_request_id);
  }
  f.ask.mutable_token_ids()->CopyFrom(request.prompt_token_ids());
  f.ask.set_cache_salt(request.cache_salt());
  f.ask.set_first_block(plan.first_block);
  f.ask.set_max_chunk_bytes(config_.max_chunk_bytes);
  f.first_started = now;
  if (!Ask(id, f, now)) return 0;
  fetches_.emplace(id, std::move(f));
  return id;
}

bool KvFetches::Ask(uint64_t id, Fetch& f, Clock::time_point now) {
  f.ask.set_transfer_id(absl::StrCat(f.request_id, "#", id, ".", f.attempt));
  f.deadline = now + absl::ToChronoNanoseconds(f.budget);
  f.chunk_ends.clear();
  f.chunks_acked = 0;
  f.source_done = false;
  f.link = links_ != nullptr ? links_->Acquire(f.source, f.target) : 0;
  f.ask.set_link_id(f.link);
  if (f.link == 0 && !f.ask.stream_request_id().empty()) return false;  // streams need a link
  if (!pool_->Send(f.source, f.ask).ok()) {
    if (f.link != 0) links_->Release(f.link, /*ok=*/true, now);  // nothing moved on it
    f.link = 0;
    return false;
  }
  by_transfer_[f.ask.transfer_id()] = id;
  return true;
}

uint64_t KvFetches::Find(const std::string& transfer_id) const {
  auto it = by_transfer_.find(transfer_id);
  return it == by_transfer_.end() ? 0 : it->second;
}

void KvFetches::OnMessage(int w, const ReceivedMessage& m, Clock::time_point now,
                          std::vector<Done>& done) {
  if (m.type == "KvChunk") {
    OnChunk(w, m, now, done);
    return;
  }
  pb::KvChunkAck ack;
  if (m.type == "KvChunkAck" && ParseMessage(m, &ack).ok()) OnAck(w, ack, now, done);
}

void KvFetches::OnChunk(int w, const ReceivedMessage& m, Clock::time_point now,
                        std::vector<Done>& done) {
  pb::KvChunk c;
  if (!ParseMessage(m, &c).ok()) return;
  const uint64_t id = Find(c.transfer_id());
  if (id == 0) return;  // a late chunk of an attempt that ended
  Fetch& f = fetches_.at(id);
  if (w != f.source) return;  // only the attempt's source speaks for it
  if (c.has_error()) {
    Fail(id, FromWire(c.error()), /*source_fresh=*/true, now, done);
    return;
  }
  if (c.num_blocks() > 0) {
    // Relayed as it came: the target checks it whole (hashes against the tokens, checksums).
    if (absl::Status s = pool_->Forward(f.target, m); !s.ok()) {
      Fail(id, absl::UnavailableError(absl::StrCat("the target cannot be reached: ", s.message())),
           /*source_fresh=*/true, now, done);
      return;
    }
    // A stream's announce is acknowledged once its receives are queued: no block is in by then.
    const bool announce = c.stream_announce();
    f.chunk_ends.push_back(static_cast<int>(c.first_block() + (announce ? 0 : c.num_blocks())));
    f.bytes += static_cast<int64_t>(m.payload.size());
    if (!announce) f.blocks_received += static_cast<int>(c.num_blocks());
  }
  f.source_done = c.last();
  if (f.source_done && f.chunks_acked == f.chunk_ends.size())
    Finish(id, absl::OkStatus(), now, done);
}

void KvFetches::OnAck(int w, const pb::KvChunkAck& ack, Clock::time_point now,
                      std::vector<Done>& done) {
  const uint64_t id = Find(ack.transfer_id());
  if (id == 0) return;
  Fetch& f = fetches_.at(id);
  if (w != f.target || f.chunks_acked >= f.chunk_ends.size()) return;
  if (ack.has_error()) {
    Fail(id, FromWire(ack.error()), /*source_fresh=*/true, now, done);
    return;
  }
  ++f.chunks_acked;
  f.blocks_added += static_cast<int>(ack.blocks_added());
  if (f.source_done && f.chunks_acked == f.chunk_ends.size())
    Finish(id, absl::OkStatus(), now, done);
}

void KvFetches::Expire(absl::Span<const WorkerView> views, Clock::time_point now,
                       std::vector<Done>& done) {
  std::vector<uint64_t> ids;
  for (const auto& [id, f] : fetches_) ids.push_back(id);
  for (uint64_t id : ids) {
    auto it = fetches_.find(id);
    if (it == fetches_.end()) continue;
    const Fetch& f = it->second;
    const WorkerView* source = FindView(views, f.source);
    const WorkerView* target = FindView(views, f.target);
    if (target == nullptr || !target->fresh) {
      Finish(id, absl::UnavailableError("the target went silent"), now, done);
    } else if (source == nullptr || !source->fresh) {
      Fail(id, absl::UnavailableError("the source went silent"), /*source_fresh=*/false, now, done);
    } else if (now >= f.deadline) {
      Fail(id,
           absl::DeadlineExceededError(
               absl::StrCat("no whole transfer within ", absl::FormatDuration(f.budget))),
           /*source_fresh=*/true, now, done);
    }
  }
}

void KvFetches::Fail(uint64_t id, const absl::Status& why, bool source_fresh, Clock::time_point now,
                     std::vector<Done>& done) {
  Fetch& f = fetches_.at(id);
  by_transfer_.erase(f.ask.transfer_id());  // its late messages are dropped
  ReleaseLink(f, now);
  if (f.attempt == 1 && source_fresh && Retryable(why.code())) {
    ++f.attempt;
    f.ask.clear_stream_request_id();  // the retry pulls what the source caches by then
    // From the first block the target has not acknowledged.
    if (f.chunks_acked > 0) f.ask.set_first_block(f.chunk_ends[f.chunks_acked - 1]);
    if (Ask(id, f, now)) {
      if (metrics_ != nullptr) {
        metrics_->CountKvFetchRetry(std::string(KvTransferFailureReason(why.code())));
      }
      return;
    }
  }
  Finish(id, why, now, done);
}

void KvFetches::Finish(uint64_t id, absl::Status status, Clock::time_point now,
                       std::vector<Done>& done) {
  auto it = fetches_.find(id);
  Fetch f = std::move(it->second);
  fetches_.erase(it);
  by_transfer_.erase(f.ask.transfer_id());
  ReleaseLink(f, now);
  if (status.ok() && f.blocks_received == 0) {
    status = absl::NotFoundError("the source no longer caches the prefix");
  }
  const double seconds = Seconds(now - f.first_started);
  if (status.ok() && f.bytes > 0 && seconds > 0 && !f.streamed) {
    gbps_ = 0.7 * gbps_ + 0.3 * static_cast<double>(f.bytes) / seconds / 1e9;
  }
  if (metrics_ != nullptr) {
    if (status.ok()) {
      metrics_->ObserveKvFetch(f.bytes, f.blocks_added, seconds, gbps_);
    } else {
      metrics_->CountKvFetchFallback(std::string(KvTransferFailureReason(status.code())));
    }
  }
  done.push_back({.request_id = std::move(f.request_id),
                  .fetch = id,
                  .first_block = f.first_block,
                  .blocks_added = f.blocks_added,
                  .status = std::move(status)});
}

void KvFetches::ReleaseLink(Fetch& f, Clock::time_point now) {
  if (f.link == 0) return;
  const bool whole = f.source_done && f.chunks_acked == f.chunk_ends.size();
  links_->Release(f.link, whole, now);
  if (metrics_ != nullptr) metrics_->CountKvLinkTransfer(whole ? "done" : "failed");
  f.link = 0;
}

void KvFetches::Cancel(uint64_t fetch) {
  auto it = fetches_.find(fetch);
  if (it == fetches_.end()) return;
  by_transfer_.erase(it->second.ask.transfer_id());
  ReleaseLink(it->second, Clock::now());
  fetches_.erase(it);
}

}  // namespace kvserve::router
