#include "worker/layer_streamer.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "worker/kv_cache/kv_block_wire.h"

namespace kvserve::worker {
namespace {

// A rank's ranges of `blocks`, layer by layer (the order both ends queue and fingerprint).
std::vector<kernels::ByteRange> AllLayerRanges(KvStorage& storage, absl::Span<const int> blocks) {
  std::vector<kernels::ByteRange> out;
  for (int l = 0; l < storage.num_layers(); ++l) {
    std::vector<kernels::ByteRange> layer = LayerRanges(storage, l, blocks);
    out.insert(out.end(), layer.begin(), layer.end());
  }
  return out;
}

absl::Status NeedsDevicePools(ModelRunner& runner) {
  if (runner.has_kv_pools() && runner.backend(0).name() != "cpu") return absl::OkStatus();
  return absl::FailedPreconditionError("layer streaming needs a device backend with KV pools");
}

}  // namespace

absl::Status LayerStreamer::StartStream(const std::string& request_id, int first_block,
                                        PeerLinks links,
                                        std::function<void(const StreamStep&)> on_step) {
  RETURN_IF_ERROR(NeedsDevicePools(*runner_));
  if (static_cast<int>(links.size()) != runner_->size() || first_block < 0) {
    return absl::InvalidArgumentError(absl::StrCat("layer streaming: ", links.size(), " links for ",
                                                   runner_->size(), " ranks, from block ",
                                                   first_block));
  }
  if (find_request_(request_id) == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("layer streaming: no request ", request_id, " here"));
  }
  auto stream = std::make_unique<OutStream>();
  stream->request_id = request_id;
  for (const std::unique_ptr<kernels::PeerLink>& l : links) stream->links.push_back(l.get());
  stream->on_step = std::move(on_step);
  stream->next_block = first_block;
  streams_.push_back(std::move(stream));
  return absl::OkStatus();
}

std::vector<LayerStreamer::Send> LayerStreamer::PlanSends(StepPlan& plan) {
  std::vector<Send> sends;
  if (streams_.empty()) return sends;
  const int bs = block_size_;
  for (const Scheduler::ScheduledSeq& s : plan.scheduled) {
    const Sequence& seq = *s.seq;
    if (seq.sample_index != 0 || seq.prefill_done()) continue;
    for (const std::unique_ptr<OutStream>& stream : streams_) {
      if (stream->ended || stream->request_id != seq.request->input.request_id) continue;
      const int full =
          std::min(seq.num_computed_tokens + s.num_new_tokens, seq.num_prompt_tokens) / bs;
      if (full <= stream->next_block) continue;
      Send send{.stream = stream.get(), .first_block = stream->next_block};
      send.blocks.assign(seq.block_table.begin() + stream->next_block,
                         seq.block_table.begin() + full);
      stream->on_step(
          {.first_block = send.first_block, .num_blocks = static_cast<int>(send.blocks.size())});
      sends.push_back(std::move(send));
    }
  }
  if (sends.empty()) return sends;
  // Called by each rank's thread as a layer's KV writes are queued: that layer's bytes of every
  // send, on the rank's link, behind the rank's compute. A failure is the rank's own slot.
  auto errors = std::make_shared<std::vector<absl::Status>>(runner_->size());
  std::vector<KvStorage*> pools;
  std::vector<kernels::Backend*> backends;
  for (int r = 0; r < runner_->size(); ++r) {
    pools.push_back(&runner_->device_kv(r));
    backends.push_back(&runner_->backend(r));
  }
  plan.batch.after_kv_write = [sends, errors, pools, backends](int rank, int layer) {
    for (const Send& send : sends) {
      if (!(*errors)[rank].ok()) return;
      (*errors)[rank] = send.stream->links[rank]->StartSend(
          LayerRanges(*pools[rank], layer, send.blocks), backends[rank]);
    }
  };
  send_errors_ = std::move(errors);
  return sends;
}

void LayerStreamer::FinishSends(std::vector<Send>& sends) {
  absl::Status failed;
  if (send_errors_) {
    for (const absl::Status& s : *send_errors_) failed.Update(s);
    send_errors_.reset();
  }
  for (Send& send : sends) {
    OutStream& stream = *send.stream;
    kv_->Hold(send.blocks);  // read by the sends until PollLayerStreams sees them done
    stream.held.insert(stream.held.end(), send.blocks.begin(), send.blocks.end());
    stream.next_block = send.first_block + static_cast<int>(send.blocks.size());
    StreamStep step{.first_block = send.first_block,
                    .num_blocks = static_cast<int>(send.blocks.size())};
    if (failed.ok()) step.fingerprints = Fingerprints(send.blocks);
    const Request* req = find_request_(stream.request_id);
    const int prompt_blocks =
        req == nullptr ? 0 : req->sequences[0]->num_prompt_tokens / block_size_;
    step.last = !failed.ok() || stream.next_block >= prompt_blocks;
    stream.ended = step.last;
    if (!failed.ok()) LOG(WARNING) << "layer stream of " << stream.request_id << ": " << failed;
    stream.on_step(step);
  }
}

std::vector<uint64_t> LayerStreamer::Fingerprints(absl::Span<const int> blocks) {
  std::vector<uint64_t> out;
  for (int r = 0; r < runner_->size(); ++r) {
    out.push_back(runner_->backend(r).Fingerprint(AllLayerRanges(runner_->device_kv(r), blocks)));
  }
  return out;
}

absl::StatusOr<bool> LayerStreamer::Poll() {
  absl::Status failed;
  for (auto it = streams_.begin(); it != streams_.end();) {
    OutStream& stream = **it;
    if (!stream.ended && find_request_(stream.request_id) == nullptr) {
      stream.ended = true;  // the request ended before its prompt's blocks were all sent
      stream.on_step({.first_block = stream.next_block, .last = true});
    }
    absl::Status error;
    bool done = true;
    for (kernels::PeerLink* link : stream.links) {
      absl::StatusOr<bool> one = link->PollSend();
      error.Update(one.status());
      done = done && one.ok() && *one;
    }
    if (error.ok() && !done) {
      ++it;
      continue;
    }
    kv_->Unhold(stream.held);  // sent, or a link failed and was aborted (nothing reads them)
    stream.held.clear();
    failed.Update(error);
    if (!error.ok() && !stream.ended) {
      stream.ended = true;
      stream.on_step({.first_block = stream.next_block, .last = true});
    }
    if (stream.ended) {
      it = streams_.erase(it);
    } else {
      ++it;
    }
  }
  RETURN_IF_ERROR(failed);
  return streams_.empty();
}

absl::Status LayerStreamer::StartReceive(PeerLinks links, absl::Span<const int32_t> prompt,
                                         const std::string& cache_salt, int first_block,
                                         int num_blocks) {
  RETURN_IF_ERROR(NeedsDevicePools(*runner_));
  if (static_cast<int>(links.size()) != runner_->size()) {
    return absl::FailedPreconditionError(
        absl::StrCat("layer streaming: ", links.size(), " links for ", runner_->size(), " ranks"));
  }
  const int prompt_blocks = static_cast<int>(prompt.size()) / block_size_;
  if (first_block < 0 || num_blocks < 1 || first_block + num_blocks > prompt_blocks) {
    return absl::InvalidArgumentError(absl::StrCat("layer streaming: blocks ", first_block, " + ",
                                                   num_blocks, " of a prompt of ", prompt_blocks,
                                                   " full blocks"));
  }
  ASSIGN_OR_RETURN(std::vector<int> targets, transfer_->Allocate(num_blocks));
  transfer_->SynchronizeRanks();  // nothing still reads the blocks the receives will write
  for (int l = 0; l < runner_->device_kv(0).num_layers(); ++l) {
    for (int r = 0; r < runner_->size(); ++r) {
      if (absl::Status s = links[r]->StartReceive(LayerRanges(runner_->device_kv(r), l, targets));
          !s.ok()) {
        kv_->ReleaseReceived(targets);
        return s;
      }
    }
  }
  receives_.push_back({.link0 = links[0].get(),
                       .prompt = std::vector<int32_t>(prompt.begin(), prompt.end()),
                       .cache_salt = cache_salt,
                       .first_block = first_block,
                       .targets = std::move(targets)});
  return absl::OkStatus();
}

absl::StatusOr<std::optional<int>> LayerStreamer::FinishReceive(
    PeerLinks links, absl::Span<const uint64_t> fingerprints) {
  auto it = std::find_if(receives_.begin(), receives_.end(), [&](const Receive& r) {
    return !links.empty() && r.link0 == links[0].get();
  });
  if (it == receives_.end() || static_cast<int>(links.size()) != runner_->size()) {
    return absl::FailedPreconditionError("layer streaming: no receive queued on these links");
  }
  absl::Status failed;
  bool done = true;
  for (const std::unique_ptr<kernels::PeerLink>& link : links) {
    absl::StatusOr<bool> one = link->PollReceive();
    failed.Update(one.status());
    done = done && one.ok() && *one;
  }
  if (failed.ok() && !done) return std::nullopt;
  Receive r = std::move(*it);
  receives_.erase(it);
  absl::StatusOr<int> added =
      failed.ok() ? CacheReceived(r, fingerprints) : absl::StatusOr<int>(failed);
  if (!added.ok()) kv_->ReleaseReceived(r.targets);
  RETURN_IF_ERROR(added.status());
  return *added;
}

absl::StatusOr<int> LayerStreamer::CacheReceived(const Receive& r,
                                                 absl::Span<const uint64_t> fingerprints) {
  if (static_cast<int>(fingerprints.size()) != runner_->size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layer streaming: ", fingerprints.size(), " fingerprints for ", runner_->size(), " ranks"));
  }
  const std::vector<uint64_t> got = Fingerprints(r.targets);
  for (int rank = 0; rank < runner_->size(); ++rank) {
    if (got[rank] != fingerprints[rank]) {
      return absl::DataLossError(absl::StrCat(
          "layer streaming: rank ", rank, "'s ", r.targets.size(), " blocks from block ",
          r.first_block, " have fingerprint ", got[rank], ", the sender's ", fingerprints[rank]));
    }
  }
  ASSIGN_OR_RETURN(std::vector<BlockHash> all, transfer_->Hashes(r.prompt, r.cache_salt));
  RETURN_IF_ERROR(transfer_->CheckChain(all, r.first_block));
  return transfer_->CacheWritten(r.prompt, all, r.first_block, r.targets);
}

void LayerStreamer::DropLink(const kernels::PeerLink* link0) {
  for (auto it = streams_.begin(); it != streams_.end();) {
    if ((*it)->links.empty() || (*it)->links[0] != link0) {
      ++it;
      continue;
    }
    kv_->Unhold((*it)->held);
    it = streams_.erase(it);
  }
  for (auto it = receives_.begin(); it != receives_.end();) {
    if (it->link0 != link0) {
      ++it;
      continue;
    }
    kv_->ReleaseReceived(it->targets);
    it = receives_.erase(it);
  }
}

}  // namespace kvserve::worker
