#include "worker/server/layer_streams.h"

#include <algorithm>
#include <memory>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/kv/kv_transfer.h"
#include "glog/logging.h"
#include "worker/server/process_clock.h"
#include "worker/server/wire.h"

namespace kvserve::worker {
namespace pb = ::kvserve::v1;

void LayerStreams::Ask(const std::string& identity, const pb::KvExportRequest& req, bool running) {
  if (req.link_id() == 0) {
    SendError(identity, req, 0,
              absl::InvalidArgumentError(
                  "KvExportRequest: a layer stream (stream_request_id) needs a link_id"));
    return;
  }
  // A link carries one transfer at a time: so the asks waiting here are at most the links.
  if (links_->Find(identity, req.link_id()) == nullptr) {
    SendError(identity, req, 0,
              absl::FailedPreconditionError(
                  absl::StrCat("KV link ", req.link_id(), " is not open here")));
    return;
  }
  for (const StreamAsk& a : asks_) {
    if (a.req.stream_request_id() == req.stream_request_id() ||
        (a.identity == identity && a.req.link_id() == req.link_id())) {
      SendError(identity, req, 0,
                absl::AlreadyExistsError(
                    absl::StrCat("a layer stream of request '", a.req.stream_request_id(),
                                 "' waits for KV link ", a.req.link_id(), " already")));
      return;
    }
  }
  asks_.push_back({.identity = identity, .req = req});
  // Its request normally follows; one already running streams what its later steps compute.
  if (running) Start(req.stream_request_id());
}

void LayerStreams::SendError(const std::string& identity, const pb::KvExportRequest& req,
                             uint32_t index, const absl::Status& why) {
  pb::KvChunk c;
  c.set_transfer_id(req.transfer_id());
  c.set_index(index);
  c.set_last(true);
  c.set_first_block(req.first_block());
  c.set_link_id(req.link_id());
  ToWire(why, c.mutable_error());
  metrics_->CountKvTransferFailure("out", std::string(KvTransferFailureReason(why.code())));
  replies_->Send(identity, c);
}

void LayerStreams::Fail(const std::string& request_id, const absl::Status& why) {
  auto it = std::find_if(asks_.begin(), asks_.end(), [&](const StreamAsk& a) {
    return a.req.stream_request_id() == request_id;
  });
  if (it == asks_.end()) return;
  SendError(
      it->identity, it->req, 0,
      absl::Status(why.code(), absl::StrCat("the streamed request failed here: ", why.message())));
  asks_.erase(it);
}

void LayerStreams::Start(const std::string& request_id) {
  auto it = std::find_if(asks_.begin(), asks_.end(), [&](const StreamAsk& a) {
    return a.req.stream_request_id() == request_id;
  });
  if (it == asks_.end()) return;
  StreamAsk ask = std::move(*it);
  asks_.erase(it);
  KvLink* link = links_->Find(ask.identity, ask.req.link_id());
  if (link == nullptr) {
    SendError(ask.identity, ask.req, 0,
              absl::FailedPreconditionError(
                  absl::StrCat("KV link ", ask.req.link_id(), " is not open here")));
    return;
  }
  // What each of the stream's steps sends the router: its chunk's numbering and timing.
  struct Out {
    StreamAsk ask;
    uint32_t index = 0;
    Clock::time_point announced;
  };
  auto out = std::make_shared<Out>(Out{.ask = std::move(ask)});
  const int bs = engine_->config().cache.block_size;
  const int first = static_cast<int>(
      std::min<int64_t>(out->ask.req.first_block(), out->ask.req.token_ids_size() / bs));
  absl::Status s = engine_->StreamPrefill(
      request_id, first, *link, [this, out, bs](const Engine::StreamStep& step) {
        const pb::KvExportRequest& req = out->ask.req;
        pb::KvChunk c;
        c.set_transfer_id(req.transfer_id());
        c.set_index(out->index++);
        c.set_first_block(step.first_block);
        c.set_num_blocks(step.num_blocks);
        c.set_last(step.last);
        c.set_link_id(req.link_id());
        c.set_cache_salt(req.cache_salt());
        const int end = std::min((step.first_block + step.num_blocks) * bs, req.token_ids_size());
        c.mutable_token_ids()->Add(req.token_ids().begin(), req.token_ids().begin() + end);
        const auto now = Clock::now();
        if (step.num_blocks > 0 && step.fingerprints.empty() && !step.last) {
          c.set_stream_announce(true);
          out->announced = now;
        } else if (!step.fingerprints.empty()) {
          c.mutable_stream_fingerprints()->Add(step.fingerprints.begin(), step.fingerprints.end());
          metrics_->ObserveKvChunk("out", engine_->kv_spec().CacheKeyDType(), step.num_blocks,
                                   step.num_blocks * engine_->KvWireBlockBytes(),
                                   Seconds(now - out->announced));
        } else if (step.num_blocks > 0) {  // the step's sends failed: the link is aborted here
          const absl::Status why = absl::UnavailableError(
              absl::StrCat("the layer stream's sends of blocks ", step.first_block, " + ",
                           step.num_blocks, " over KV link ", req.link_id(), " failed"));
          ToWire(why, c.mutable_error());
          metrics_->CountKvTransferFailure("out", std::string(KvTransferFailureReason(why.code())));
        }
        replies_->Send(out->ask.identity, c);
      });
  if (!s.ok()) SendError(out->ask.identity, out->ask.req, 0, s);
}

void LayerStreams::OnChunk(const std::string& identity, const pb::KvChunk& c) {
  if (!c.stream_announce()) {
    finishes_.push_back({.identity = identity, .chunk = c, .since = Clock::now()});
    Poll();
    return;
  }
  // The bytes are on their way whatever this worker does: it takes them (a draining worker
  // too), or the link is dropped.
  pb::KvChunkAck ack;
  ack.set_transfer_id(c.transfer_id());
  ack.set_index(c.index());
  KvLink* link = links_->Find(identity, c.link_id());
  const std::vector<int32_t> tokens(c.token_ids().begin(), c.token_ids().end());
  const absl::Status s = link == nullptr
                             ? absl::FailedPreconditionError(
                                   absl::StrCat("KV link ", c.link_id(), " is not open here"))
                             : engine_->StartStreamedReceive(*link, tokens, c.cache_salt(),
                                                             static_cast<int>(c.first_block()),
                                                             static_cast<int>(c.num_blocks()));
  if (!s.ok()) {
    ToWire(s, ack.mutable_error());
    metrics_->CountKvTransferFailure("in", std::string(KvTransferFailureReason(s.code())));
    if (link != nullptr) links_->Drop(identity, c.link_id(), s);
  }
  replies_->Send(identity, ack);
}

void LayerStreams::Poll() {
  // A source's sends after its request's last step (Step polls them while it has work).
  if (engine_->HasLayerStreams() && !engine_->HasWork()) {
    if (absl::StatusOr<bool> s = engine_->PollLayerStreams(); !s.ok()) {
      LOG(WARNING) << "layer streaming: " << s.status();
    }
  }
  // A target's receives, in order on each link.
  absl::flat_hash_set<std::pair<std::string, uint32_t>> waiting;
  for (auto it = finishes_.begin(); it != finishes_.end();) {
    const pb::KvChunk& c = it->chunk;
    const uint32_t link_id = c.link_id();
    const std::pair<std::string, uint32_t> key{it->identity, link_id};
    if (waiting.contains(key)) {
      ++it;
      continue;
    }
    KvLink* link = links_->Find(it->identity, c.link_id());
    const std::vector<uint64_t> fingerprints(c.stream_fingerprints().begin(),
                                             c.stream_fingerprints().end());
    absl::StatusOr<std::optional<int>> added =
        link == nullptr
            ? absl::FailedPreconditionError(absl::StrCat("KV link ", c.link_id(), " was closed"))
            : engine_->FinishStreamedReceive(*link, fingerprints);
    if (added.ok() && !added->has_value()) {
      waiting.insert(key);
      ++it;
      continue;
    }
    pb::KvChunkAck ack;
    ack.set_transfer_id(c.transfer_id());
    ack.set_index(c.index());
    if (added.ok()) {
      ack.set_blocks_added(**added);
      metrics_->ObserveKvChunk("in", engine_->kv_spec().CacheKeyDType(), **added,
                               c.num_blocks() * engine_->KvWireBlockBytes(),
                               Seconds(Clock::now() - it->since));
    } else {
      ToWire(added.status(), ack.mutable_error());
      metrics_->CountKvTransferFailure("in",
                                       std::string(KvTransferFailureReason(added.status().code())));
    }
    const std::string identity = it->identity;
    it = finishes_.erase(it);
    if (!added.ok() && link != nullptr) links_->Drop(identity, link_id, added.status());
    replies_->Send(identity, ack);
  }
}

bool LayerStreams::waiting() const { return !finishes_.empty() || engine_->HasLayerStreams(); }

void LayerStreams::ForgetLink(const std::string& router, uint32_t link_id) {
  std::erase_if(asks_, [&](const StreamAsk& a) {
    return a.identity == router && a.req.link_id() == link_id;
  });
}

}  // namespace kvserve::worker
