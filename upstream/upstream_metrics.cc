// kvserve-upstream's metrics (upstream_metrics.h).
#include "upstream/upstream_metrics.h"

#include "prometheus/family.h"
#include "prometheus/text_serializer.h"

namespace kvserve::upstream {

UpstreamMetrics::UpstreamMetrics(const std::string& upstream)
    : registry_(std::make_shared<prometheus::Registry>()) {
  const prometheus::Labels base = {{"upstream", upstream}};
  auto counter = [&](const char* name, const char* help, const char* key, const char* value) {
    prometheus::Labels l = base;
    if (key != nullptr) l[key] = value;
    return &prometheus::BuildCounter().Name(name).Help(help).Register(*registry_).Add(l);
  };
  auto gauge = [&](const char* name, const char* help) {
    return &prometheus::BuildGauge().Name(name).Help(help).Register(*registry_).Add(base);
  };
  const char* requests = "Requests the router sent, by what became of them";
  sent = counter("kvserve_upstream_requests_total", requests, "result", "sent");
  refused = counter("kvserve_upstream_requests_total", requests, "result", "refused");
  failed = counter("kvserve_upstream_requests_total", requests, "result", "failed");
  unreached = counter("kvserve_upstream_requests_total", requests, "result", "unreached");
  const char* scrapes = "Reads of the upstream's /metrics";
  scrapes_ok = counter("kvserve_upstream_scrapes_total", scrapes, "result", "ok");
  scrapes_failed = counter("kvserve_upstream_scrapes_total", scrapes, "result", "failed");
  const char* batches = "vLLM-format KV-event batches read from the upstream";
  batches_applied = counter("kvserve_upstream_event_batches_total", batches, "result", "applied");
  batches_undecodable =
      counter("kvserve_upstream_event_batches_total", batches, "result", "undecodable");
  gaps = counter("kvserve_upstream_event_gaps_total", "Gaps in the upstream's event sequence",
                 nullptr, nullptr);
  replays = counter("kvserve_upstream_event_replays_total",
                    "Replays asked of the upstream's replay socket", nullptr, nullptr);
  restarts = counter("kvserve_upstream_restarts_total",
                     "New upstream processes seen (start time changed, or events from seq 0)",
                     nullptr, nullptr);
  const char* skipped = "Stored blocks the bridge could not place, by reason";
  orphans = counter("kvserve_upstream_blocks_skipped_total", skipped, "reason", "orphan");
  wrong_size = counter("kvserve_upstream_blocks_skipped_total", skipped, "reason", "block_size");
  ready = gauge("kvserve_upstream_ready", "1 when the upstream is scraped and may take requests");
  in_flight = gauge("kvserve_upstream_requests_in_flight", "Requests streaming from the upstream");
  indexed_blocks =
      gauge("kvserve_upstream_indexed_blocks", "Blocks the bridge believes the upstream caches");
}

std::string UpstreamMetrics::Serialize() const {
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

}  // namespace kvserve::upstream
