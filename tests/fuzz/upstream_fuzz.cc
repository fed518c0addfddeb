// What an OpenAI upstream's peers may send the router: its /metrics text (ParsePrometheusText,
// VllmLoad) and its vLLM-format KV events (Decode, then VllmEventTranslator over a stream of
// them). The first byte picks which. No crash, no unbounded allocation; the translator's view
// stays consistent: its snapshot lists every block it holds, once or twice (two media).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/kv/vllm_kv_events.h"
#include "upstream/prometheus_text.h"
#include "upstream/vllm_event_translator.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvserve;
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] & 1) {
    absl::StatusOr<std::vector<upstream::Sample>> samples =
        upstream::ParsePrometheusText(rest, 1000);
    if (samples.ok()) upstream::VllmLoad(*samples);
    return 0;
  }
  // Several payloads in one input, split at 0xC1 (a byte msgpack never uses): a stream.
  upstream::VllmEventTranslator t("fuzz-extra-key", 4);
  for (size_t start = 0; start <= rest.size();) {
    size_t end = rest.find('\xc1', start);
    if (end == std::string_view::npos) end = rest.size();
    absl::StatusOr<vllm_events::Batch> b = vllm_events::Decode(rest.substr(start, end - start));
    if (b.ok()) t.Translate(b->events);
    start = end + 1;
  }
  const size_t listed = t.Snapshot().size();
  if (listed < t.size() || listed > 2 * t.size()) __builtin_trap();
  return 0;
}
