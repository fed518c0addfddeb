// WorkerServer: layer streaming between workers (docs/DISAGGREGATION.md). A prefill worker
// sends a request's prompt blocks over a device-to-device link layer by layer as its steps
// compute them (Engine::StreamPrefill), telling the router each step's blocks before the step
// (an announcing KvChunk) and their fingerprints after it; the decode worker queues the receives
// on the announce and caches the blocks once their bytes arrived and match. Loop thread, which
// is also the engine's: the engine calls the stream's steps back from Step.
#include <algorithm>
#include <memory>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/kv_transfer.h"
#include "glog/logging.h"
#include "worker/server/process_clock.h"
#include "worker/server/worker_server.h"

namespace kvserve::worker {
namespace {

namespace pb = ::kvserve::v1;

void SetError(const absl::Status& s, pb::Error* e) {
  e->set_code(static_cast<int>(s.code()));
  e->set_message(std::string(s.message()));
}

}  // namespace

void WorkerServer::AskLayerStream(const std::string& identity, const pb::KvExportRequest& req) {
  KVSERVE_CHECK_THREAD(loop_thread_);
  if (req.link_id() == 0) {
    SendStreamError(identity, req, 0,
                    absl::InvalidArgumentError(
                        "KvExportRequest: a layer stream (stream_request_id) needs a link_id"));
    return;
  }
  // A link carries one transfer at a time: so the asks waiting here are at most the links.
  if (FindKvLink(identity, req.link_id()) == nullptr) {
    SendStreamError(identity, req, 0,
                    absl::FailedPreconditionError(
                        absl::StrCat("KV link ", req.link_id(), " is not open here")));
    return;
  }
  for (const StreamAsk& a : stream_asks_) {
    if (a.req.stream_request_id() == req.stream_request_id() ||
        (a.identity == identity && a.req.link_id() == req.link_id())) {
      SendStreamError(identity, req, 0,
                      absl::AlreadyExistsError(
                          absl::StrCat("a layer stream of request '", a.req.stream_request_id(),
                                       "' waits for KV link ", a.req.link_id(), " already")));
      return;
    }
  }
  stream_asks_.push_back({.identity = identity, .req = req});
  // Its request normally follows; one already running streams what its later steps compute.
  if (routes_.contains(req.stream_request_id())) StartLayerStream(req.stream_request_id());
}

void WorkerServer::SendStreamError(const std::string& identity, const pb::KvExportRequest& req,
                                   uint32_t index, const absl::Status& why) {
  KVSERVE_CHECK_THREAD(loop_thread_);
  pb::KvChunk c;
  c.set_transfer_id(req.transfer_id());
  c.set_index(index);
  c.set_last(true);
  c.set_first_block(req.first_block());
  c.set_link_id(req.link_id());
  SetError(why, c.mutable_error());
  metrics_->CountKvTransferFailure("out", std::string(KvTransferFailureReason(why.code())));
  Reply(identity, c);
}

void WorkerServer::FailStreamAsk(const std::string& request_id, const absl::Status& why) {
  KVSERVE_CHECK_THREAD(loop_thread_);
  auto it = std::find_if(stream_asks_.begin(), stream_asks_.end(), [&](const StreamAsk& a) {
    return a.req.stream_request_id() == request_id;
  });
  if (it == stream_asks_.end()) return;
  SendStreamError(
      it->identity, it->req, 0,
      absl::Status(why.code(), absl::StrCat("the streamed request failed here: ", why.message())));
  stream_asks_.erase(it);
}

void WorkerServer::StartLayerStream(const std::string& request_id) {
  KVSERVE_CHECK_THREAD(loop_thread_);
  auto it = std::find_if(stream_asks_.begin(), stream_asks_.end(), [&](const StreamAsk& a) {
    return a.req.stream_request_id() == request_id;
  });
  if (it == stream_asks_.end()) return;
  StreamAsk ask = std::move(*it);
  stream_asks_.erase(it);
  KvLink* link = FindKvLink(ask.identity, ask.req.link_id());
  if (link == nullptr) {
    SendStreamError(ask.identity, ask.req, 0,
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
        KVSERVE_CHECK_THREAD(loop_thread_);  // the engine's steps run on this thread
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
          SetError(why, c.mutable_error());
          metrics_->CountKvTransferFailure("out", std::string(KvTransferFailureReason(why.code())));
        }
        Reply(out->ask.identity, c);
      });
  if (!s.ok()) SendStreamError(out->ask.identity, out->ask.req, 0, s);
}

void WorkerServer::HandleStreamedChunk(const std::string& identity, const pb::KvChunk& c) {
  KVSERVE_CHECK_THREAD(loop_thread_);
  if (!c.stream_announce()) {
    stream_finishes_.push_back({.identity = identity, .chunk = c, .since = Clock::now()});
    PollLayerStreams();
    return;
  }
  // The bytes are on their way whatever this worker does: it takes them (a draining worker
  // too), or the link is dropped.
  pb::KvChunkAck ack;
  ack.set_transfer_id(c.transfer_id());
  ack.set_index(c.index());
  KvLink* link = FindKvLink(identity, c.link_id());
  const std::vector<int32_t> tokens(c.token_ids().begin(), c.token_ids().end());
  const absl::Status s = link == nullptr
                             ? absl::FailedPreconditionError(
                                   absl::StrCat("KV link ", c.link_id(), " is not open here"))
                             : engine_->StartStreamedReceive(*link, tokens, c.cache_salt(),
                                                             static_cast<int>(c.first_block()),
                                                             static_cast<int>(c.num_blocks()));
  if (!s.ok()) {
    SetError(s, ack.mutable_error());
    metrics_->CountKvTransferFailure("in", std::string(KvTransferFailureReason(s.code())));
    if (link != nullptr) DropKvLink(identity, c.link_id(), s);
  }
  Reply(identity, ack);
}

void WorkerServer::PollLayerStreams() {
  KVSERVE_CHECK_THREAD(loop_thread_);
  // A source's sends after its request's last step (Step polls them while it has work).
  if (engine_->HasLayerStreams() && !engine_->HasWork()) {
    if (absl::StatusOr<bool> s = engine_->PollLayerStreams(); !s.ok()) {
      LOG(WARNING) << "layer streaming: " << s.status();
    }
  }
  // A target's receives, in order on each link.
  absl::flat_hash_set<std::pair<std::string, uint32_t>> waiting;
  for (auto it = stream_finishes_.begin(); it != stream_finishes_.end();) {
    const pb::KvChunk& c = it->chunk;
    const uint32_t link_id = c.link_id();
    const std::pair<std::string, uint32_t> key{it->identity, link_id};
    if (waiting.contains(key)) {
      ++it;
      continue;
    }
    KvLink* link = FindKvLink(it->identity, c.link_id());
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
      SetError(added.status(), ack.mutable_error());
      metrics_->CountKvTransferFailure("in",
                                       std::string(KvTransferFailureReason(added.status().code())));
    }
    const std::string identity = it->identity;
    it = stream_finishes_.erase(it);
    if (!added.ok() && link != nullptr) DropKvLink(identity, link_id, added.status());
    Reply(identity, ack);
  }
}

bool WorkerServer::LayerStreamsWaiting() const {
  KVSERVE_CHECK_THREAD(loop_thread_);
  return !stream_finishes_.empty() || engine_->HasLayerStreams();
}

}  // namespace kvserve::worker
