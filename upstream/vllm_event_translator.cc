// vLLM-format KV events re-hashed into kvserve's (vllm_event_translator.h).
#include "upstream/vllm_event_translator.h"

#include <utility>

namespace kvserve::upstream {
namespace {

using kvserve::v1::KvEvent;
using kvserve::v1::Medium;

// vLLM names media "GPU" and "CPU" (and leaves it out before 0.10: the device).
Medium MediumOf(const std::string& m) {
  return m == "CPU" ? kvserve::v1::MEDIUM_HOST : kvserve::v1::MEDIUM_DEVICE;
}

}  // namespace

std::vector<KvEvent> VllmEventTranslator::Translate(const std::vector<vllm_events::Event>& events) {
  std::vector<KvEvent> out;
  for (const vllm_events::Event& e : events) {
    switch (e.kind) {
      case vllm_events::Event::Kind::kStored:
        Store(e, out);
        break;
      case vllm_events::Event::Kind::kRemoved:
        Remove(e, out);
        break;
      case vllm_events::Event::Kind::kAllCleared:
        ClearAll(out);
        break;
    }
  }
  return out;
}

void VllmEventTranslator::Store(const vllm_events::Event& e, std::vector<KvEvent>& out) {
  const int64_t n = static_cast<int64_t>(e.block_hashes.size());
  if (e.block_size != block_size_ || static_cast<int64_t>(e.token_ids.size()) != n * block_size_) {
    counters_.wrong_size += n;
    return;
  }
  std::optional<BlockHash> parent;
  if (e.parent_block_hash) {
    auto it = blocks_.find(*e.parent_block_hash);
    if (it == blocks_.end()) {
      counters_.orphans += n;
      return;
    }
    parent = it->second.ours;
  }
  const Medium medium = MediumOf(e.medium);
  kvserve::v1::BlockStored* stored = out.emplace_back().mutable_stored();
  stored->set_medium(medium);
  if (parent) stored->set_parent_block_hash(parent->ToBytes());
  for (int64_t i = 0; i < n; ++i) {
    const auto* begin = reinterpret_cast<const uint32_t*>(e.token_ids.data()) + i * block_size_;
    const BlockHash ours =
        HashBlock(parent ? &*parent : nullptr, absl::MakeConstSpan(begin, block_size_), extra_key_);
    Block& b = blocks_[e.block_hashes[i]];
    b.ours = ours;
    ++(medium == kvserve::v1::MEDIUM_HOST ? b.host : b.device);
    stored->add_block_hashes(ours.ToBytes());
    parent = ours;
  }
  stored->mutable_token_ids()->Add(e.token_ids.begin(), e.token_ids.end());
  counters_.stored += n;
}

void VllmEventTranslator::Remove(const vllm_events::Event& e, std::vector<KvEvent>& out) {
  const Medium medium = MediumOf(e.medium);
  kvserve::v1::BlockRemoved* removed = nullptr;
  for (int64_t h : e.block_hashes) {
    auto it = blocks_.find(h);
    if (it == blocks_.end()) {
      ++counters_.unknown_removed;
      continue;
    }
    ++counters_.removed;
    int& copies = medium == kvserve::v1::MEDIUM_HOST ? it->second.host : it->second.device;
    if (copies == 0) {
      ++counters_.unknown_removed;  // not cached in this medium
      continue;
    }
    if (--copies > 0) continue;  // another copy is still cached
    if (removed == nullptr) {
      removed = out.emplace_back().mutable_removed();
      removed->set_medium(medium);
    }
    removed->add_block_hashes(it->second.ours.ToBytes());
    if (it->second.host == 0 && it->second.device == 0) blocks_.erase(it);
  }
}

void VllmEventTranslator::ClearAll(std::vector<KvEvent>& out) {
  blocks_.clear();
  out.emplace_back().mutable_all_cleared();
  ++counters_.cleared;
}

std::vector<kvserve::v1::CachedBlock> VllmEventTranslator::Snapshot() const {
  std::vector<kvserve::v1::CachedBlock> blocks;
  for (const auto& [engine_hash, b] : blocks_) {
    for (auto [copies, medium] : {std::pair{b.device, kvserve::v1::MEDIUM_DEVICE},
                                  std::pair{b.host, kvserve::v1::MEDIUM_HOST}}) {
      if (copies == 0) continue;
      kvserve::v1::CachedBlock& c = blocks.emplace_back();
      c.set_block_hash(b.ours.ToBytes());
      c.set_medium(medium);
    }
  }
  return blocks;
}

}  // namespace kvserve::upstream
