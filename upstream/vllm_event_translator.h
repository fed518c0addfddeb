// vLLM-format KV events (common/kv/vllm_kv_events.h) read as kvserve's own (KvEvent), for an
// OpenAI-compatible upstream that the router does not run (vLLM, SGLang, another kvserve): the
// stored blocks are re-hashed from their token_ids with kvserve's block hash and the extra key
// the router hashes that upstream's prompts with, so the engine's own hash function and seed do
// not matter. Removals name the engine's hashes: the translator keeps the engine's hash → ours
// for every block it believes cached.
//
// A stored chain whose parent the translator never saw (it joined late or missed a batch)
// cannot be re-hashed, since a block's hash covers its whole prefix: those blocks are skipped
// and counted (orphans) until a replay from the stream's start brings the parents. A block of
// another size than the upstream's is skipped and counted too.
//
//   VllmEventTranslator t(extra_key, /*block_size=*/16);
//   std::vector<kvserve::v1::KvEvent> ours = t.Translate(decoded_batch.events);
//
// Not thread-safe: one owner (the upstream bridge's thread).
#ifndef KVSERVE_UPSTREAM_VLLM_EVENT_TRANSLATOR_H_
#define KVSERVE_UPSTREAM_VLLM_EVENT_TRANSLATOR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/kv/block_hash.h"
#include "common/kv/vllm_kv_events.h"
#include "kvserve/v1/kvserve.pb.h"

namespace kvserve::upstream {

class VllmEventTranslator {
 public:
  struct Counters {
    int64_t stored = 0, removed = 0, cleared = 0;
    int64_t orphans = 0;          // stored blocks skipped: parent unknown
    int64_t wrong_size = 0;       // stored blocks skipped: another block size or token count
    int64_t unknown_removed = 0;  // removals of blocks never seen stored
  };

  VllmEventTranslator(std::string extra_key, int block_size)
      : extra_key_(std::move(extra_key)), block_size_(block_size) {}

  // kvserve's events for `events`, in order; the translator's view of the cache follows them.
  std::vector<kvserve::v1::KvEvent> Translate(const std::vector<vllm_events::Event>& events);
  // Every block believed cached, per medium: what a KvSnapshot carries.
  [[nodiscard]] std::vector<kvserve::v1::CachedBlock> Snapshot() const;
  // Forgets everything (a new upstream instance, or before a replay from the start).
  void Clear() { blocks_.clear(); }
  [[nodiscard]] const Counters& counters() const { return counters_; }
  [[nodiscard]] size_t size() const { return blocks_.size(); }

 private:
  struct Block {
    BlockHash ours;
    // Copies cached per medium: vLLM can cache one block twice (two concurrent prompts compute
    // it) and removes each copy apart; the block is gone when its last copy is.
    int device = 0, host = 0;
  };
  void Store(const vllm_events::Event& e, std::vector<kvserve::v1::KvEvent>& out);
  void Remove(const vllm_events::Event& e, std::vector<kvserve::v1::KvEvent>& out);
  void ClearAll(std::vector<kvserve::v1::KvEvent>& out);

  std::string extra_key_;
  int block_size_;
  absl::flat_hash_map<int64_t, Block> blocks_;  // the engine's hash → ours
  Counters counters_;
};

}  // namespace kvserve::upstream

#endif  // KVSERVE_UPSTREAM_VLLM_EVENT_TRANSLATOR_H_
