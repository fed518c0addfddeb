#include "worker/prefix_transfer.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/kv_cache/kv_block_wire.h"

namespace kvserve::worker {
namespace {

// The engine thread reads and writes every rank's pool between steps, through that rank's
// backend (a CUDA backend makes its own device current for each op), while the rank threads
// wait for the next step.
absl::Status NeedsPools(const ModelRunner& runner, const KvCacheManager& kv) {
  if (!runner.has_kv_pools()) {
    return absl::FailedPreconditionError("KV transfer: this device keeps no KV (null or sim)");
  }
  if (!kv.prefix_caching()) {
    return absl::FailedPreconditionError("KV transfer needs prefix caching on");
  }
  return absl::OkStatus();
}

// FailedPrecondition unless there is one link per rank.
absl::Status OneLinkPerRank(absl::Span<const std::unique_ptr<kernels::PeerLink>> links, int ranks) {
  if (static_cast<int>(links.size()) == ranks) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("KV transfer: ", links.size(), " links for ",
                                                    ranks, " tensor-parallel ranks (one each)"));
}

// InvalidArgument unless a chunk starts at a block and holds at least one.
absl::Status ChunkBounds(int first_block, int max_blocks) {
  if (first_block >= 0 && max_blocks >= 1) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("KV transfer: blocks from ", first_block, ", at most ", max_blocks, " a chunk"));
}

// FailedPrecondition unless got[i] is the prompt's block first_block + i (`hashes`: the
// prompt's from first_block on) for every i.
absl::Status MatchPrompt(absl::Span<const BlockHash> hashes, absl::Span<const BlockHash> got,
                         int first_block) {
  for (size_t i = 0; i < got.size(); ++i) {
    if (i >= hashes.size() || got[i] != hashes[i]) {
      return absl::FailedPreconditionError(
          absl::StrCat("KV transfer: block ", first_block + i, " is not the prompt's block ",
                       first_block + i, " (another prompt, cache salt, model or KV format)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

int64_t PrefixTransfer::WireBytesPerBlock() {
  if (!NeedsPools(*runner_, *kv_).ok()) return 0;
  int64_t total = 0;
  for (int r = 0; r < runner_->size(); ++r) total += WireBlockBytes(runner_->device_kv(r));
  return total;
}

absl::Status PrefixTransfer::ExportChunks(absl::Span<const int32_t> prompt,
                                          const std::string& cache_salt, int first_block,
                                          int blocks_per_chunk,
                                          const std::function<bool(PrefixChunk)>& each) {
  RETURN_IF_ERROR(NeedsPools(*runner_, *kv_));
  RETURN_IF_ERROR(ChunkBounds(first_block, blocks_per_chunk));
  ASSIGN_OR_RETURN(std::vector<BlockHash> all, hashes_(prompt, cache_salt));
  SynchronizeRanks();  // the steps that wrote them have finished
  for (size_t at = first_block;;) {
    CachedChunk c = CachedBlocks(all, at, blocks_per_chunk);
    PrefixChunk chunk{.first_block = static_cast<int>(at),
                      .num_blocks = static_cast<int>(c.blocks.size()),
                      .more = c.more};
    at += c.blocks.size();
    for (int r = 0; r < runner_->size(); ++r) {
      ASSIGN_OR_RETURN(std::string w, Staging(r).Encode(c.blocks, c.hashes));
      chunk.wires.push_back(std::move(w));
    }
    if (!each(std::move(chunk)) || !c.more) return absl::OkStatus();
  }
}

PrefixTransfer::CachedChunk PrefixTransfer::CachedBlocks(absl::Span<const BlockHash> all,
                                                         size_t first_block, int max_blocks) const {
  CachedChunk out;
  for (size_t at = first_block; at < all.size(); ++at) {
    std::optional<int> b = kv_->pool().Lookup(all[at]);
    if (!b) break;
    if (static_cast<int>(out.blocks.size()) == max_blocks) {
      out.more = true;
      break;
    }
    out.blocks.push_back(*b);
    out.hashes.push_back(all[at]);
  }
  return out;
}

absl::StatusOr<int> PrefixTransfer::Import(absl::Span<const int32_t> prompt,
                                           const std::string& cache_salt,
                                           absl::Span<const std::string> wires, int first_block) {
  RETURN_IF_ERROR(NeedsPools(*runner_, *kv_));
  if (static_cast<int>(wires.size()) != runner_->size()) {
    return absl::FailedPreconditionError(
        absl::StrCat("KV transfer: ", wires.size(), " wires for ", runner_->size(),
                     " tensor-parallel ranks (the sender's TP size must be this worker's)"));
  }
  ASSIGN_OR_RETURN(std::vector<BlockHash> all, hashes_(prompt, cache_salt));
  RETURN_IF_ERROR(CheckChain(all, first_block));
  const absl::Span<const BlockHash> hashes = absl::MakeConstSpan(all).subspan(first_block);
  // Every rank's wire is checked, and each block matched to the prompt, before any write.
  std::vector<std::vector<WireBlock>> got;
  for (int r = 0; r < runner_->size(); ++r) {
    ASSIGN_OR_RETURN(std::vector<WireBlock> blocks, ReadBlocks(wires[r], runner_->device_kv(r)));
    if (r > 0 && blocks.size() != got[0].size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "KV transfer: rank ", r, " sent ", blocks.size(), " blocks, rank 0 ", got[0].size()));
    }
    std::vector<BlockHash> got_hashes;
    for (const WireBlock& b : blocks) got_hashes.push_back(b.hash);
    RETURN_IF_ERROR(MatchPrompt(hashes, got_hashes, first_block));
    got.push_back(std::move(blocks));
  }
  return CacheArrived(prompt, all, first_block, static_cast<int>(got[0].size()),
                      [&](const std::vector<std::pair<int, size_t>>& writes) {
                        for (int r = 0; r < runner_->size(); ++r) {
                          std::vector<const WireBlock*> blocks;
                          std::vector<int> targets;
                          for (const auto& [block, i] : writes) {
                            blocks.push_back(&got[r][i]);
                            targets.push_back(block);
                          }
                          Staging(r).Write(blocks, targets);
                        }
                      });
}

absl::StatusOr<PrefixChunk> PrefixTransfer::StageForLink(absl::Span<const int32_t> prompt,
                                                         const std::string& cache_salt,
                                                         int first_block, int max_blocks) {
  RETURN_IF_ERROR(NeedsPools(*runner_, *kv_));
  RETURN_IF_ERROR(ChunkBounds(first_block, max_blocks));
  ASSIGN_OR_RETURN(std::vector<BlockHash> all, hashes_(prompt, cache_salt));
  SynchronizeRanks();  // the steps that wrote them have finished
  CachedChunk c = CachedBlocks(all, first_block, max_blocks);
  PrefixChunk chunk{
      .first_block = first_block, .num_blocks = static_cast<int>(c.blocks.size()), .more = c.more};
  for (int r = 0; r < runner_->size(); ++r) {
    ASSIGN_OR_RETURN(std::string header, Staging(r).StageForLink(c.blocks, c.hashes));
    chunk.wires.push_back(std::move(header));
  }
  return chunk;
}

absl::Status PrefixTransfer::StartSendStaged(
    absl::Span<const std::unique_ptr<kernels::PeerLink>> links) {
  RETURN_IF_ERROR(NeedsPools(*runner_, *kv_));
  RETURN_IF_ERROR(OneLinkPerRank(links, runner_->size()));
  for (int r = 0; r < runner_->size(); ++r) {
    RETURN_IF_ERROR(Staging(r).StartSendStaged(*links[r]));
  }
  return absl::OkStatus();
}

absl::StatusOr<int> PrefixTransfer::ReceiveFromLink(
    absl::Span<const std::unique_ptr<kernels::PeerLink>> links, absl::Span<const int32_t> prompt,
    const std::string& cache_salt, absl::Span<const std::string> headers, int first_block) {
  RETURN_IF_ERROR(NeedsPools(*runner_, *kv_));
  RETURN_IF_ERROR(OneLinkPerRank(links, runner_->size()));
  if (static_cast<int>(headers.size()) != runner_->size()) {
    return absl::FailedPreconditionError(
        absl::StrCat("KV transfer: ", headers.size(), " link headers for ", runner_->size(),
                     " tensor-parallel ranks (the sender's TP size must be this worker's)"));
  }
  // Headers that are not these pools' shape are refused before the links move a byte.
  std::vector<LinkHeader> got;
  for (int r = 0; r < runner_->size(); ++r) {
    ASSIGN_OR_RETURN(LinkHeader h, ReadLinkHeader(headers[r], runner_->device_kv(r)));
    if (r > 0 && h.hashes != got[0].hashes) {
      return absl::InvalidArgumentError(
          absl::StrCat("KV transfer: rank ", r, "'s link header names other blocks than rank 0's"));
    }
    got.push_back(std::move(h));
  }
  // Every rank's link takes its bytes, so that the links stay in step when one rank's bytes
  // are refused (DataLoss); any other error leaves the links dead.
  absl::Status received;
  for (int r = 0; r < runner_->size(); ++r) {
    absl::Status s = Staging(r).ReceiveFromLink(*links[r], got[r]);
    if (!s.ok() && !absl::IsDataLoss(s)) return s;
    if (received.ok() && !s.ok())
      received = absl::DataLossError(absl::StrCat("rank ", r, ": ", s.message()));
  }
  RETURN_IF_ERROR(received);
  ASSIGN_OR_RETURN(std::vector<BlockHash> all, hashes_(prompt, cache_salt));
  RETURN_IF_ERROR(CheckChain(all, first_block));
  RETURN_IF_ERROR(
      MatchPrompt(absl::MakeConstSpan(all).subspan(first_block), got[0].hashes, first_block));
  return CacheArrived(prompt, all, first_block, static_cast<int>(got[0].hashes.size()),
                      [&](const std::vector<std::pair<int, size_t>>& writes) {
                        std::vector<int> staged, targets;
                        for (const auto& [block, i] : writes) {
                          staged.push_back(static_cast<int>(i));
                          targets.push_back(block);
                        }
                        for (int r = 0; r < runner_->size(); ++r) {
                          Staging(r).WriteReceived(staged, targets);
                        }
                      });
}

void PrefixTransfer::SynchronizeRanks() {
  for (int r = 0; r < runner_->size(); ++r) runner_->backend(r).Synchronize();
}

KvStaging& PrefixTransfer::Staging(int rank) {
  if (staging_.empty()) {
    for (int r = 0; r < runner_->size(); ++r) {
      staging_.push_back(std::make_unique<KvStaging>(runner_->device_kv(r), runner_->backend(r)));
    }
  }
  return *staging_[rank];
}

absl::Status PrefixTransfer::CheckChain(absl::Span<const BlockHash> all, int first_block) const {
  if (first_block < 0 || static_cast<size_t>(first_block) > all.size()) {
    return absl::InvalidArgumentError(absl::StrCat("KV transfer: first block ", first_block,
                                                   " of a prompt of ", all.size(), " blocks"));
  }
  // A chunk continues a chain: without its parent here, no request could reach its blocks.
  if (first_block > 0 && !kv_->pool().Lookup(all[first_block - 1])) {
    return absl::FailedPreconditionError(absl::StrCat(
        "KV transfer: block ", first_block - 1, ", the parent of the chunk, is not cached here"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int> PrefixTransfer::CacheArrived(
    absl::Span<const int32_t> prompt, absl::Span<const BlockHash> all, int first_block, int count,
    const std::function<void(const std::vector<std::pair<int, size_t>>&)>& write) {
  std::vector<size_t> fresh;  // blocks (from first_block) not cached here yet
  for (int i = 0; i < count; ++i) {
    if (!kv_->pool().Lookup(all[first_block + i])) fresh.push_back(i);
  }
  ASSIGN_OR_RETURN(const std::vector<int> targets, Allocate(static_cast<int>(fresh.size())));
  std::vector<std::pair<int, size_t>> writes;
  for (size_t j = 0; j < fresh.size(); ++j) writes.emplace_back(targets[j], fresh[j]);
  write(writes);
  // Cached last first, as a freed chain is: its tail is evicted first.
  for (size_t j = fresh.size(); j-- > 0;)
    CacheBlock(prompt, all, first_block + fresh[j], targets[j]);
  return static_cast<int>(fresh.size());
}

absl::StatusOr<std::vector<int>> PrefixTransfer::Allocate(int n) {
  std::optional<std::vector<int>> targets = kv_->AllocateReceived(n);
  if (!targets) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KV transfer: the device pool has no room for ", n, " blocks"));
  }
  // Blocks evicted to make room may be spilling to the host tier: they leave before the writes.
  if (BlockCopies copies = kv_->TakeCopies(); !copies.empty()) {
    absl::StatusOr<ForwardOutput> done = runner_->Execute(copies, ForwardBatch{});
    kv_->FinishCopies();
    if (!done.ok()) {
      kv_->ReleaseReceived(*targets);
      return done.status();
    }
  }
  return *std::move(targets);
}

bool PrefixTransfer::CacheBlock(absl::Span<const int32_t> prompt, absl::Span<const BlockHash> all,
                                size_t at, int block) {
  if (kv_->pool().Lookup(all[at])) {
    kv_->ReleaseReceived({block});
    return false;
  }
  const int bs = block_size_;
  BlockContent content;
  if (at > 0) content.parent = all[at - 1];
  content.tokens.assign(prompt.begin() + at * bs, prompt.begin() + (at + 1) * bs);
  kv_->CacheReceived(block, all[at], content);
  return true;
}

int PrefixTransfer::CacheWritten(absl::Span<const int32_t> prompt, absl::Span<const BlockHash> all,
                                 int first_block, absl::Span<const int> targets) {
  int cached = 0;
  for (size_t j = targets.size(); j-- > 0;)
    cached += CacheBlock(prompt, all, first_block + j, targets[j]);
  return cached;
}

int PrefixTransfer::CachedRun(absl::Span<const BlockHash> hashes, int first_block) const {
  int n = 0;
  while (first_block + n < static_cast<int>(hashes.size()) &&
         kv_->pool().Lookup(hashes[first_block + n])) {
    ++n;
  }
  return n;
}

absl::StatusOr<int> PrefixTransfer::Adopt(absl::Span<const int32_t> prompt,
                                          const std::string& cache_salt, int first_block,
                                          int blocks) {
  if (runner_->has_kv_pools()) {
    return absl::FailedPreconditionError(
        "AdoptPrefix is for devices that keep no KV (sim, null); this one takes ImportPrefix");
  }
  if (!kv_->prefix_caching()) {
    return absl::FailedPreconditionError("KV transfer needs prefix caching on");
  }
  ASSIGN_OR_RETURN(std::vector<BlockHash> all, hashes_(prompt, cache_salt));
  RETURN_IF_ERROR(CheckChain(all, first_block));
  const int count = std::clamp(blocks, 0, static_cast<int>(all.size()) - first_block);
  return CacheArrived(prompt, all, first_block, count,
                      [](const std::vector<std::pair<int, size_t>>&) {});
}

}  // namespace kvserve::worker
