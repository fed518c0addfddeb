// Engine::ExportPrefix and Engine::ImportPrefix: a prompt's cached KV blocks leave one engine
// and join another's prefix cache (docs/DISAGGREGATION.md). Engine thread, between steps.
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/engine.h"
#include "worker/kv_cache/kv_block_wire.h"

namespace kvserve::worker {
namespace {

absl::Status NeedsPools(const ModelRunner& runner, const KvCacheManager& kv, Device device) {
  if (!runner.has_kv_pools()) {
    return absl::FailedPreconditionError("KV transfer: this device keeps no KV (null or sim)");
  }
  if (!kv.prefix_caching()) {
    return absl::FailedPreconditionError("KV transfer needs prefix caching on");
  }
  // The engine thread reads and writes every rank's pool; a CUDA rank's pool belongs to its
  // thread's device.
  if (device == Device::kCuda && runner.size() > 1) {
    return absl::UnimplementedError(
        "KV transfer with tensor parallelism on CUDA is not built yet (docs/DISAGGREGATION.md)");
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

absl::StatusOr<std::vector<std::string>> Engine::ExportPrefix(absl::Span<const int32_t> prompt,
                                                              const std::string& cache_salt) {
  KVSERVE_CHECK_THREAD(engine_thread_);
  RETURN_IF_ERROR(NeedsPools(*runner_, *kv_, config_.backend.device));
  ASSIGN_OR_RETURN(std::vector<BlockHash> hashes, PromptHashes(prompt, cache_salt));
  std::vector<int> blocks;
  for (const BlockHash& h : hashes) {
    std::optional<int> b = kv_->pool().Lookup(h);
    if (!b) break;
    blocks.push_back(*b);
  }
  hashes.resize(blocks.size());
  std::vector<std::string> wires;
  for (int r = 0; r < runner_->size(); ++r) {
    runner_->backend(r).Synchronize();  // the steps that wrote them have finished
    ASSIGN_OR_RETURN(std::string w,
                     EncodeBlocks(runner_->device_kv(r), runner_->backend(r), blocks, hashes));
    wires.push_back(std::move(w));
  }
  return wires;
}

absl::StatusOr<int> Engine::ImportPrefix(absl::Span<const int32_t> prompt,
                                         const std::string& cache_salt,
                                         absl::Span<const std::string> wires) {
  KVSERVE_CHECK_THREAD(engine_thread_);
  RETURN_IF_ERROR(NeedsPools(*runner_, *kv_, config_.backend.device));
  if (static_cast<int>(wires.size()) != runner_->size()) {
    return absl::FailedPreconditionError(
        absl::StrCat("KV transfer: ", wires.size(), " wires for ", runner_->size(),
                     " tensor-parallel ranks (the sender's TP size must be this worker's)"));
  }
  ASSIGN_OR_RETURN(std::vector<BlockHash> hashes, PromptHashes(prompt, cache_salt));
  // Every rank's wire is checked, and each block matched to the prompt, before any write.
  std::vector<std::vector<WireBlock>> got;
  for (int r = 0; r < runner_->size(); ++r) {
    ASSIGN_OR_RETURN(std::vector<WireBlock> blocks, ReadBlocks(wires[r], runner_->device_kv(r)));
    if (r > 0 && blocks.size() != got[0].size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "KV transfer: rank ", r, " sent ", blocks.size(), " blocks, rank 0 ", got[0].size()));
    }
    for (size_t i = 0; i < blocks.size(); ++i) {
      if (i >= hashes.size() || blocks[i].hash != hashes[i]) {
        return absl::FailedPreconditionError(
            absl::StrCat("KV transfer: block ", i, " is not the prompt's block ", i,
                         " (another prompt, cache salt, model or KV format)"));
      }
    }
    got.push_back(std::move(blocks));
  }
  std::vector<size_t> fresh;  // blocks not cached here yet
  for (size_t i = 0; i < got[0].size(); ++i) {
    if (!kv_->pool().Lookup(hashes[i])) fresh.push_back(i);
  }
  std::optional<std::vector<int>> targets = kv_->AllocateReceived(static_cast<int>(fresh.size()));
  if (!targets) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KV transfer: the device pool has no room for ", fresh.size(), " blocks"));
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
  for (int r = 0; r < runner_->size(); ++r) {
    for (size_t j = 0; j < fresh.size(); ++j) {
      WriteBlock(runner_->device_kv(r), runner_->backend(r), (*targets)[j], got[r][fresh[j]]);
    }
    runner_->backend(r).Synchronize();
  }
  // Cached last first, as a freed chain is: its tail is evicted first.
  const int bs = config_.cache.block_size;
  for (size_t j = fresh.size(); j-- > 0;) {
    const size_t i = fresh[j];
    BlockContent content;
    if (i > 0) content.parent = hashes[i - 1];
    content.tokens.assign(prompt.begin() + i * bs, prompt.begin() + (i + 1) * bs);
    kv_->CacheReceived((*targets)[j], hashes[i], content);
  }
  return static_cast<int>(fresh.size());
}

}  // namespace kvserve::worker
