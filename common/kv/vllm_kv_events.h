// vLLM's KV cache events as its ZeroMQ publisher sends them (vllm/distributed/kv_events.py), so
// that consumers written for vLLM (llm-d's KV-cache manager, Dynamo, SGLang's model gateway,
// AIBrix) read a kvserve worker's cache. Written from vLLM's published definitions; docs/INTEROP.md
// has the field tables.
//
// A payload is one msgpack-encoded batch: [ts (float, Unix seconds), [event, ...],
// data_parallel_rank]. Events come in one of two encodings vLLM has used:
//   kMap   (vLLM 0.24 on, since its PR #42892; the default): maps tagged by "type", fields in
//          definition order:
//          {"type": "BlockStored", "block_hashes", "parent_block_hash", "token_ids",
//           "block_size", "lora_id", "medium", "lora_name"}, {"type": "BlockRemoved",
//           "block_hashes", "medium"}, {"type": "AllBlocksCleared"}
//   kArray (vLLM up to 0.23): tagged arrays, ["BlockStored", block_hashes, parent_block_hash,
//           token_ids, block_size, lora_id, medium, lora_name], ["BlockRemoved", block_hashes,
//           medium], ["AllBlocksCleared"] (lora_name since vLLM's PR #27577; 0.10's arrays
//           ended at medium)
// Block hashes are 64-bit integers (ExternalHash); lora_id and lora_name are nil (kvserve
// serves no adapters). Pure functions; safe from any thread.
#ifndef KVSERVE_COMMON_KV_VLLM_KV_EVENTS_H_
#define KVSERVE_COMMON_KV_VLLM_KV_EVENTS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/kv/block_hash.h"

namespace kvserve::vllm_events {

enum class Encoding { kMap, kArray };

// "map" or "array"; anything else is InvalidArgument naming the choices.
absl::StatusOr<Encoding> ParseEncoding(std::string_view name);

struct Event {
  enum class Kind { kStored, kRemoved, kAllCleared };
  Kind kind = Kind::kStored;
  std::vector<int64_t> block_hashes;         // stored, removed: in chain order
  std::optional<int64_t> parent_block_hash;  // stored: the first block's parent; none at a start
  std::vector<int32_t> token_ids;            // stored: block_size per block
  int block_size = 0;                        // stored
  std::string medium;                        // stored, removed: "GPU" or "CPU" (Decode: "" if none)
};

struct Batch {
  double ts = 0;  // Unix seconds
  std::vector<Event> events;
  int data_parallel_rank = 0;
};

// A message's sequence frame: 8 bytes, big-endian, signed (vLLM's seq.to_bytes(8, "big")); the
// replay socket ends its answer with kReplayEnd. DecodeSeq reads the first 8 bytes of `frame`,
// which must have them.
inline constexpr int64_t kReplayEnd = -1;
std::string EncodeSeq(int64_t seq);
int64_t DecodeSeq(std::string_view frame);

// The msgpack payload of `batch`.
std::string Encode(const Batch& batch, Encoding encoding);

// Reads a payload as vLLM's publishers have sent it, for a consumer: the batch as an array
// [ts, events] (vLLM 0.9) or [ts, events, data_parallel_rank], or as a map of those names
// (vLLM's newest); each event a tagged array (0.9: no medium) or a map tagged by "type"; fields
// past those kvserve reads are ignored. Block hashes may be integers or bytes (vLLM without
// VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES), the latter read as StableHash64 of the bytes, so that a
// stored and a removed block still match. An event type kvserve does not know is skipped and
// counted in `*unknown` (when given). Anything else malformed, or past the sizes a worker could
// honestly send (64 MiB, 1M elements per list, nesting 8 deep), is InvalidArgument naming it.
absl::StatusOr<Batch> Decode(std::string_view payload, int* unknown = nullptr);

// A kvserve block hash as vLLM's consumers read block hashes: a 64-bit integer. The low half's
// 63 low bits, so that it is the same non-negative number to signed and unsigned decoders.
int64_t ExternalHash(const BlockHash& hash);

// Appends a stored block to `events`: extends the last event when it is a stored chain of the
// same medium ending in `parent`, else starts a new one (what vLLM sends: a run of blocks).
void AddStoredBlock(std::vector<Event>& events, const BlockHash& hash,
                    const std::optional<BlockHash>& parent, absl::Span<const int32_t> tokens,
                    int block_size, std::string_view medium);

// Appends a removed block, extending the last event when it is a removal of the same medium.
void AddRemovedBlock(std::vector<Event>& events, const BlockHash& hash, std::string_view medium);

}  // namespace kvserve::vllm_events

#endif  // KVSERVE_COMMON_KV_VLLM_KV_EVENTS_H_
