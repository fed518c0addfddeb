// Engine::ExportPrefix and Engine::ImportPrefix (and their device-to-device twins over an NCCL
// link): a prompt's cached KV blocks leave one engine and join another's prefix cache
// (docs/DISAGGREGATION.md). Engine thread, between steps.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "worker/engine.h"
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

absl::StatusOr<std::vector<BlockHash>> Engine::PromptHashes(absl::Span<const int32_t> prompt,
                                                            const std::string& cache_salt) const {
  KVSERVE_CHECK_THREAD(engine_thread_);
  ASSIGN_OR_RETURN(std::string key, ExtraKey(cache_salt));
  const size_t bs = config_.cache.block_size;
  std::vector<BlockHash> out;
  for (size_t i = 0; (i + 1) * bs <= prompt.size(); ++i) {
    std::vector<uint32_t> block(prompt.begin() + i * bs, prompt.begin() + (i + 1) * bs);
    out.push_back(HashBlock(i == 0 ? nullptr : &out.back(), block, key));
  }
  return out;
}

int64_t Engine::KvWireBlockBytes() {
  KVSERVE_CHECK_THREAD(engine_thread_);
  if (!NeedsPools(*runner_, *kv_).ok()) return 0;
  int64_t total = 0;
  for (int r = 0; r < runner_->size(); ++r) total += WireBlockBytes(runner_->device_kv(r));
  return total;
}

absl::StatusOr<Engine::PrefixChunk> Engine::ExportPrefix(absl::Span<const int32_t> prompt,
                                                         const std::string& cache_salt,
                                                         int first_block, int max_blocks) {
  KVSERVE_CHECK_THREAD(engine_thread_);
  Settle();  // no step in flight (async scheduling): it sees what the steps left
  std::optional<PrefixChunk> out;
  RETURN_IF_ERROR(
      ExportPrefixChunks(prompt, cache_salt, first_block, max_blocks, [&](PrefixChunk c) {
        out = std::move(c);
        return false;
      }));
  return *std::move(out);
}

absl::Status Engine::ExportPrefixChunks(absl::Span<const int32_t> prompt,
                                        const std::string& cache_salt, int first_block,
                                        int blocks_per_chunk,
                                        const std::function<bool(PrefixChunk)>& each) {
  KVSERVE_CHECK_THREAD(engine_thread_);
  Settle();  // no step in flight (async scheduling): it sees what the steps left
  RETURN_IF_ERROR(NeedsPools(*runner_, *kv_));
  RETURN_IF_ERROR(ChunkBounds(first_block, blocks_per_chunk));
  ASSIGN_OR_RETURN(std::vector<BlockHash> all, PromptHashes(prompt, cache_salt));
  SynchronizeRanks();  // the steps that wrote them have finished
  for (size_t at = first_block;;) {
    CachedChunk c = CachedBlocks(all, at, blocks_per_chunk);
    PrefixChunk chunk{.first_block = static_cast<int>(at),
                      .num_blocks = static_cast<int>(c.blocks.size()),
                      .more = c.more};
    at += c.blocks.size();
    for (int r = 0; r < runner_->size(); ++r) {
      ASSIGN_OR_RETURN(std::string w, TransferStaging(r).Encode(c.blocks, c.hashes));
      chunk.wires.push_back(std::move(w));
    }
    if (!each(std::move(chunk)) || !c.more) return absl::OkStatus();
  }
}

Engine::CachedChunk Engine::CachedBlocks(absl::Span<const BlockHash> all, size_t first_block,
                                         int max_blocks) const {
  KVSERVE_CHECK_THREAD(engine_thread_);
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

absl::StatusOr<int> Engine::ImportPrefix(absl::Span<const int32_t> prompt,
                                         const std::string& cache_salt,
                                         absl::Span<const std::string> wires, int first_block) {
  KVSERVE_CHECK_THREAD(engine_thread_);
  Settle();  // no step in flight (async scheduling): it sees what the steps left
  RETURN_IF_ERROR(NeedsPools(*runner_, *kv_));
  if (static_cast<int>(wires.size()) != runner_->size()) {
    return absl::FailedPreconditionError(
        absl::StrCat("KV transfer: ", wires.size(), " wires for ", runner_->size(),
                     " tensor-parallel ranks (the sender's TP size must be this worker's)"));
  }
  ASSIGN_OR_RETURN(std::vector<BlockHash> all, PromptHashes(prompt, cache_salt));
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
                        KVSERVE_CHECK_THREAD(engine_thread_);  // called back right here
                        for (int r = 0; r < runner_->size(); ++r) {
                          std::vector<const WireBlock*> blocks;
                          std::vector<int> targets;
                          for (const auto& [block, i] : writes) {
                            blocks.push_back(&got[r][i]);
                            targets.push_back(block);
                          }
                          TransferStaging(r).Write(blocks, targets);
                        }
                      });
}

absl::StatusOr<Engine::PrefixChunk> Engine::StagePrefixForLink(absl::Span<const int32_t> prompt,
                                                               const std::string& cache_salt,
                                                               int first_block, int max_blocks) {
  KVSERVE_CHECK_THREAD(engine_thread_);
  Settle();  // no step in flight (async scheduling): it sees what the steps left
  RETURN_IF_ERROR(NeedsPools(*runner_, *kv_));
  RETURN_IF_ERROR(ChunkBounds(first_block, max_blocks));
  ASSIGN_OR_RETURN(std::vector<BlockHash> all, PromptHashes(prompt, cache_salt));
  SynchronizeRanks();  // the steps that wrote them have finished
  CachedChunk c = CachedBlocks(all, first_block, max_blocks);
  PrefixChunk chunk{
      .first_block = first_block, .num_blocks = static_cast<int>(c.blocks.size()), .more = c.more};
  for (int r = 0; r < runner_->size(); ++r) {
    ASSIGN_OR_RETURN(std::string header, TransferStaging(r).StageForLink(c.blocks, c.hashes));
    chunk.wires.push_back(std::move(header));
  }
  return chunk;
}

absl::Status Engine::StartSendStagedPrefix(
    absl::Span<const std::unique_ptr<kernels::PeerLink>> links) {
  KVSERVE_CHECK_THREAD(engine_thread_);
  Settle();  // no step in flight (async scheduling): it sees what the steps left
  RETURN_IF_ERROR(NeedsPools(*runner_, *kv_));
  RETURN_IF_ERROR(OneLinkPerRank(links, runner_->size()));
  for (int r = 0; r < runner_->size(); ++r) {
    RETURN_IF_ERROR(TransferStaging(r).StartSendStaged(*links[r]));
  }
  return absl::OkStatus();
}

absl::Status Engine::SendStagedPrefix(absl::Span<const std::unique_ptr<kernels::PeerLink>> links) {
  KVSERVE_CHECK_THREAD(engine_thread_);
  Settle();  // no step in flight (async scheduling): it sees what the steps left
  RETURN_IF_ERROR(StartSendStagedPrefix(links));
  while (true) {
    ASSIGN_OR_RETURN(const bool done, kernels::PollSends(links));
    if (done) return absl::OkStatus();
    absl::SleepFor(absl::Microseconds(50));
  }
}

absl::StatusOr<int> Engine::ReceivePrefixFromLink(
    absl::Span<const std::unique_ptr<kernels::PeerLink>> links, absl::Span<const int32_t> prompt,
    const std::string& cache_salt, absl::Span<const std::string> headers, int first_block) {
  KVSERVE_CHECK_THREAD(engine_thread_);
  Settle();  // no step in flight (async scheduling): it sees what the steps left
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
    absl::Status s = TransferStaging(r).ReceiveFromLink(*links[r], got[r]);
    if (!s.ok() && !absl::IsDataLoss(s)) return s;
    if (received.ok() && !s.ok())
      received = absl::DataLossError(absl::StrCat("rank ", r, ": ", s.message()));
  }
  RETURN_IF_ERROR(received);
  ASSIGN_OR_RETURN(std::vector<BlockHash> all, PromptHashes(prompt, cache_salt));
  RETURN_IF_ERROR(CheckChain(all, first_block));
  RETURN_IF_ERROR(
      MatchPrompt(absl::MakeConstSpan(all).subspan(first_block), got[0].hashes, first_block));
  return CacheArrived(prompt, all, first_block, static_cast<int>(got[0].hashes.size()),
                      [&](const std::vector<std::pair<int, size_t>>& writes) {
                        KVSERVE_CHECK_THREAD(engine_thread_);  // called back right here
                        std::vector<int> staged, targets;
                        for (const auto& [block, i] : writes) {
                          staged.push_back(static_cast<int>(i));
                          targets.push_back(block);
                        }
                        for (int r = 0; r < runner_->size(); ++r) {
                          TransferStaging(r).WriteReceived(staged, targets);
                        }
                      });
}

void Engine::SynchronizeRanks() {
  KVSERVE_CHECK_THREAD(engine_thread_);
  for (int r = 0; r < runner_->size(); ++r) runner_->backend(r).Synchronize();
}

KvStaging& Engine::TransferStaging(int rank) {
  KVSERVE_CHECK_THREAD(engine_thread_);
  if (kv_staging_.empty()) {
    for (int r = 0; r < runner_->size(); ++r) {
      kv_staging_.push_back(
          std::make_unique<KvStaging>(runner_->device_kv(r), runner_->backend(r)));
    }
  }
  return *kv_staging_[rank];
}

absl::Status Engine::CheckChain(absl::Span<const BlockHash> all, int first_block) const {
  KVSERVE_CHECK_THREAD(engine_thread_);
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

absl::StatusOr<int> Engine::CacheArrived(
    absl::Span<const int32_t> prompt, absl::Span<const BlockHash> all, int first_block, int count,
    const std::function<void(const std::vector<std::pair<int, size_t>>&)>& write) {
  KVSERVE_CHECK_THREAD(engine_thread_);
  std::vector<size_t> fresh;  // blocks (from first_block) not cached here yet
  for (int i = 0; i < count; ++i) {
    if (!kv_->pool().Lookup(all[first_block + i])) fresh.push_back(i);
  }
  ASSIGN_OR_RETURN(const std::vector<int> targets,
                   AllocateForTransfer(static_cast<int>(fresh.size())));
  std::vector<std::pair<int, size_t>> writes;
  for (size_t j = 0; j < fresh.size(); ++j) writes.emplace_back(targets[j], fresh[j]);
  write(writes);
  // Cached last first, as a freed chain is: its tail is evicted first.
  for (size_t j = fresh.size(); j-- > 0;)
    CacheBlock(prompt, all, first_block + fresh[j], targets[j]);
  return static_cast<int>(fresh.size());
}

absl::StatusOr<std::vector<int>> Engine::AllocateForTransfer(int n) {
  KVSERVE_CHECK_THREAD(engine_thread_);
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

bool Engine::CacheBlock(absl::Span<const int32_t> prompt, absl::Span<const BlockHash> all,
                        size_t at, int block) {
  KVSERVE_CHECK_THREAD(engine_thread_);
  if (kv_->pool().Lookup(all[at])) {
    kv_->ReleaseReceived({block});
    return false;
  }
  const int bs = config_.cache.block_size;
  BlockContent content;
  if (at > 0) content.parent = all[at - 1];
  content.tokens.assign(prompt.begin() + at * bs, prompt.begin() + (at + 1) * bs);
  kv_->CacheReceived(block, all[at], content);
  return true;
}

int Engine::CacheWritten(absl::Span<const int32_t> prompt, absl::Span<const BlockHash> all,
                         int first_block, absl::Span<const int> targets) {
  KVSERVE_CHECK_THREAD(engine_thread_);
  int cached = 0;
  for (size_t j = targets.size(); j-- > 0;)
    cached += CacheBlock(prompt, all, first_block + j, targets[j]);
  return cached;
}

int Engine::CachedRun(absl::Span<const int32_t> prompt, const std::string& cache_salt,
                      int first_block) const {
  KVSERVE_CHECK_THREAD(engine_thread_);
  absl::StatusOr<std::vector<BlockHash>> all = PromptHashes(prompt, cache_salt);
  return all.ok() ? CachedRun(*all, first_block) : 0;
}

int Engine::CachedRun(absl::Span<const BlockHash> hashes, int first_block) const {
  KVSERVE_CHECK_THREAD(engine_thread_);
  int n = 0;
  while (first_block + n < static_cast<int>(hashes.size()) &&
         kv_->pool().Lookup(hashes[first_block + n])) {
    ++n;
  }
  return n;
}

absl::StatusOr<int> Engine::AdoptPrefix(absl::Span<const int32_t> prompt,
                                        const std::string& cache_salt, int first_block,
                                        int blocks) {
  KVSERVE_CHECK_THREAD(engine_thread_);
  Settle();  // no step in flight (async scheduling): it sees what the steps left
  if (runner_->has_kv_pools()) {
    return absl::FailedPreconditionError(
        "AdoptPrefix is for devices that keep no KV (sim, null); this one takes ImportPrefix");
  }
  if (!kv_->prefix_caching()) {
    return absl::FailedPreconditionError("KV transfer needs prefix caching on");
  }
  ASSIGN_OR_RETURN(std::vector<BlockHash> all, PromptHashes(prompt, cache_salt));
  RETURN_IF_ERROR(CheckChain(all, first_block));
  const int count = std::clamp(blocks, 0, static_cast<int>(all.size()) - first_block);
  return CacheArrived(prompt, all, first_block, count,
                      [](const std::vector<std::pair<int, size_t>>&) {});
}

}  // namespace kvserve::worker
