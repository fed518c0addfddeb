// What an OpenAI upstream's peers may send the router: its /metrics text (ParsePrometheusText,
// VllmLoad; ParsePrometheusFamilies, merged as the router's /metrics merges its workers', and
// written back: the text written reads back as the same families) and its vLLM-format KV events
// (Decode, then VllmEventTranslator over a stream of them). The first byte picks which. No crash,
// no unbounded allocation; the translator's view stays consistent: its snapshot lists every block
// it holds, once or twice (two media).
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>

#include "common/kv/vllm_kv_events.h"
#include "common/net/prometheus_text.h"
#include "router/fleet_vllm_metrics.h"
#include "upstream/vllm_event_translator.h"
#include "upstream/vllm_load.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvserve;
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] & 1) {
    absl::StatusOr<std::vector<Sample>> samples = ParsePrometheusText(rest, 1000);
    if (samples.ok()) upstream::VllmLoad(*samples);
    absl::StatusOr<std::vector<MetricFamily>> families = ParsePrometheusFamilies(rest, 1000);
    if (!families.ok()) return 0;
    const std::vector<MetricFamily> merged = router::MergeVllmFamilies({*families, *families});
    for (const std::vector<MetricFamily>* f : {&std::as_const(*families), &merged}) {
      absl::StatusOr<std::vector<MetricFamily>> back =
          ParsePrometheusFamilies(WritePrometheusText(*f), 4000);
      if (!back.ok() || back->size() != f->size()) __builtin_trap();
      for (size_t i = 0; i < f->size(); ++i) {
        if ((*back)[i].name != (*f)[i].name ||
            (*back)[i].samples.size() != (*f)[i].samples.size()) {
          __builtin_trap();
        }
      }
    }
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
