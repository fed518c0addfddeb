#include "worker/server/kv_transfers.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/kv/kv_transfer.h"
#include "common/status_macros.h"
#include "worker/server/process_clock.h"
#include "worker/server/wire.h"

namespace kvserve::worker {
namespace {

namespace pb = ::kvserve::v1;

constexpr uint32_t kDefaultChunkBytes = 4u << 20;

// Blocks a chunk of `req` carries: its byte budget (0: 4 MiB) over a block's, at least one.
int BlocksPerChunk(const pb::KvExportRequest& req, int64_t block_bytes) {
  const uint32_t max_bytes = req.max_chunk_bytes() > 0 ? req.max_chunk_bytes() : kDefaultChunkBytes;
  return static_cast<int>(std::max<int64_t>(1, max_bytes / std::max<int64_t>(1, block_bytes)));
}

}  // namespace

void KvTransfers::OnMessage(const ReceivedMessage& m, const std::string* draining,
                            absl::FunctionRef<bool(const std::string&)> running) {
  pb::KvExportRequest req;
  pb::KvChunk chunk;
  google::protobuf::Message* out =
      m.type == "KvChunk" ? static_cast<google::protobuf::Message*>(&chunk) : &req;
  if (absl::Status s = ParseMessage(m, out); !s.ok()) {
    metrics_->CountDropped("malformed_payload");
    pb::ControlReply r;
    ToWire(s, r.mutable_error());
    replies_->Send(m.prefix, r);
    return;
  }
  if (m.type == "KvChunk") {
    Import(m.prefix, chunk, draining);
  } else if (!req.stream_request_id().empty()) {
    streams_->Ask(m.prefix, req, running(req.stream_request_id()));
  } else {
    Export(m.prefix, req);
  }
}

void KvTransfers::Export(const std::string& identity, const pb::KvExportRequest& req) {
  if (req.link_id() != 0) {
    const int bs = engine_->config().cache.block_size;
    link_exports_waiting_.push_back(
        {.identity = identity,
         .req = req,
         .at = static_cast<int>(std::min<uint32_t>(req.first_block(), req.token_ids_size() / bs))});
    AdvanceLinkExports();
    return;
  }
  const std::vector<int32_t> tokens(req.token_ids().begin(), req.token_ids().end());
  const int per_chunk = BlocksPerChunk(req, engine_->KvWireBlockBytes());
  const int bs = engine_->config().cache.block_size;
  const std::string format = engine_->kv_spec().CacheKeyDType();
  const int first = static_cast<int>(std::min<uint32_t>(req.first_block(), tokens.size() / bs));
  uint32_t index = 0;
  auto start = Clock::now();
  absl::Status s = engine_->ExportPrefixChunks(
      tokens, req.cache_salt(), first, per_chunk, [&](Engine::PrefixChunk chunk) {
        pb::KvChunk c;
        c.set_transfer_id(req.transfer_id());
        c.set_index(index++);
        c.set_first_block(chunk.first_block);
        c.set_num_blocks(chunk.num_blocks);
        c.set_last(!chunk.more);
        int64_t bytes = 0;
        for (std::string& w : chunk.wires) {
          bytes += static_cast<int64_t>(w.size());
          c.add_rank_wires(std::move(w));
        }
        const int end = (chunk.first_block + chunk.num_blocks) * bs;
        c.mutable_token_ids()->Add(tokens.begin(), tokens.begin() + end);
        c.set_cache_salt(req.cache_salt());
        const auto now = Clock::now();
        metrics_->ObserveKvChunk("out", format, chunk.num_blocks, bytes, Seconds(now - start));
        start = now;
        replies_->Send(identity, c);
        return true;
      });
  if (!s.ok()) {
    pb::KvChunk c;
    c.set_transfer_id(req.transfer_id());
    c.set_index(index);
    c.set_first_block(first);
    c.set_last(true);
    ToWire(s, c.mutable_error());
    metrics_->CountKvTransferFailure("out", std::string(KvTransferFailureReason(s.code())));
    replies_->Send(identity, c);
  }
}

void KvTransfers::FailLinkExport(const LinkExport& e, const absl::Status& s) {
  pb::KvChunk c;
  c.set_transfer_id(e.req.transfer_id());
  c.set_index(e.index);
  c.set_last(true);
  c.set_link_id(e.req.link_id());
  ToWire(s, c.mutable_error());
  metrics_->CountKvTransferFailure("out", std::string(KvTransferFailureReason(s.code())));
  replies_->Send(e.identity, c);
  links_->Drop(e.identity, e.req.link_id(), s);
}

absl::StatusOr<bool> KvTransfers::SendNextLinkChunk(LinkExport& e, KvLink& link) {
  const std::vector<int32_t> tokens(e.req.token_ids().begin(), e.req.token_ids().end());
  e.start = Clock::now();
  ASSIGN_OR_RETURN(Engine::PrefixChunk chunk,
                   engine_->StagePrefixForLink(tokens, e.req.cache_salt(), e.at,
                                               BlocksPerChunk(e.req, engine_->KvWireBlockBytes())));
  pb::KvChunk c;
  c.set_transfer_id(e.req.transfer_id());
  c.set_index(e.index++);
  c.set_first_block(chunk.first_block);
  c.set_num_blocks(chunk.num_blocks);
  c.set_last(!chunk.more);
  c.set_link_id(e.req.link_id());
  for (std::string& header : chunk.wires) c.add_rank_wires(std::move(header));
  const int end = (chunk.first_block + chunk.num_blocks) * engine_->config().cache.block_size;
  c.mutable_token_ids()->Add(tokens.begin(), tokens.begin() + end);
  c.set_cache_salt(e.req.cache_salt());
  if (chunk.num_blocks == 0) {
    replies_->Send(e.identity, c);
    return false;
  }
  // The bytes are on their way before the header: the target, once it has the header, waits
  // for bytes already sent.
  RETURN_IF_ERROR(engine_->StartSendStagedPrefix(link));
  replies_->Send(e.identity, c);
  e.blocks = chunk.num_blocks;
  e.at = chunk.first_block + chunk.num_blocks;
  e.more = chunk.more;
  return true;
}

void KvTransfers::AdvanceLinkExports() {
  while (link_export_ || !link_exports_waiting_.empty()) {
    if (!link_export_) {
      link_export_ = std::move(link_exports_waiting_.front());
      link_exports_waiting_.pop_front();
    } else {
      // The chunk in flight: still going, failed, or gone (then the next, if any).
      LinkExport& e = *link_export_;
      KvLink* link = links_->Find(e.identity, e.req.link_id());
      absl::StatusOr<bool> sent = link == nullptr ? absl::FailedPreconditionError(absl::StrCat(
                                                        "KV link ", e.req.link_id(), " was closed"))
                                                  : kernels::PollSends(*link);
      if (sent.ok() && !*sent) return;
      if (!sent.ok()) {
        FailLinkExport(e, sent.status());
        link_export_.reset();
        continue;
      }
      metrics_->ObserveKvChunk("out", engine_->kv_spec().CacheKeyDType(), e.blocks,
                               e.blocks * engine_->KvWireBlockBytes(),
                               Seconds(Clock::now() - e.start));
      if (!e.more) {
        link_export_.reset();
        continue;
      }
    }
    LinkExport& e = *link_export_;
    KvLink* link = links_->Find(e.identity, e.req.link_id());
    absl::StatusOr<bool> started = link == nullptr
                                       ? absl::FailedPreconditionError(absl::StrCat(
                                             "KV link ", e.req.link_id(), " is not open here"))
                                       : SendNextLinkChunk(e, *link);
    if (started.ok() && *started) return;  // in flight
    if (!started.ok()) FailLinkExport(e, started.status());
    link_export_.reset();
  }
}

void KvTransfers::Import(const std::string& identity, const pb::KvChunk& c,
                         const std::string* draining) {
  const auto start = Clock::now();
  pb::KvChunkAck ack;
  ack.set_transfer_id(c.transfer_id());
  ack.set_index(c.index());
  absl::StatusOr<int> added = absl::FailedPreconditionError(
      absl::StrCat("worker is draining (", draining != nullptr ? *draining : "",
                   "): it caches no peer's blocks"));
  if (c.has_error()) {
    added = absl::InvalidArgumentError("a KvChunk that carries an error has no blocks to cache");
  } else if (c.link_id() != 0 && (c.stream_announce() || c.stream_fingerprints_size() > 0)) {
    streams_->OnChunk(identity, c);  // acknowledged there
    return;
  } else if (c.link_id() != 0) {
    // The bytes wait on the link whatever this worker does with them: it takes them (a draining
    // worker too, the link stays in step), or the link is dropped.
    KvLink* link = links_->Find(identity, c.link_id());
    const std::vector<int32_t> tokens(c.token_ids().begin(), c.token_ids().end());
    const std::vector<std::string> headers(c.rank_wires().begin(), c.rank_wires().end());
    added = link == nullptr ? absl::FailedPreconditionError(
                                  absl::StrCat("KV link ", c.link_id(), " is not open here"))
                            : engine_->ReceivePrefixFromLink(*link, tokens, c.cache_salt(), headers,
                                                             static_cast<int>(c.first_block()));
    if (!added.ok() && link != nullptr) links_->Drop(identity, c.link_id(), added.status());
  } else if (draining == nullptr) {
    const std::vector<int32_t> tokens(c.token_ids().begin(), c.token_ids().end());
    const std::vector<std::string> wires(c.rank_wires().begin(), c.rank_wires().end());
    added = engine_->ImportPrefix(tokens, c.cache_salt(), wires, static_cast<int>(c.first_block()));
  }
  if (added.ok()) {
    ack.set_blocks_added(*added);
    int64_t bytes = 0;
    for (const std::string& w : c.rank_wires()) bytes += static_cast<int64_t>(w.size());
    if (c.link_id() != 0) bytes = c.num_blocks() * engine_->KvWireBlockBytes();
    metrics_->ObserveKvChunk("in", engine_->kv_spec().CacheKeyDType(), *added, bytes,
                             Seconds(Clock::now() - start));
  } else {
    ToWire(added.status(), ack.mutable_error());
    metrics_->CountKvTransferFailure("in",
                                     std::string(KvTransferFailureReason(added.status().code())));
  }
  replies_->Send(identity, ack);
}

}  // namespace kvserve::worker
