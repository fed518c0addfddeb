// vllm_events::Decode on anything a peer may send as a vLLM KV-event payload: no crash, no
// unbounded allocation; what decodes encodes again and decodes to the same events.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/kv/vllm_kv_events.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvserve::vllm_events;
  const std::string_view payload(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<Batch> b = Decode(payload);
  if (!b.ok()) return 0;
  for (Encoding e : {Encoding::kMap, Encoding::kArray}) {
    absl::StatusOr<Batch> again = Decode(Encode(*b, e));
    if (!again.ok() || again->events.size() != b->events.size()) __builtin_trap();
    for (size_t i = 0; i < b->events.size(); ++i) {
      const Event &x = b->events[i], &y = again->events[i];
      if (x.kind != y.kind || x.block_hashes != y.block_hashes || x.token_ids != y.token_ids ||
          x.parent_block_hash != y.parent_block_hash || x.medium != y.medium) {
        __builtin_trap();
      }
    }
  }
  return 0;
}
