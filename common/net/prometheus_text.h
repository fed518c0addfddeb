// Prometheus' text exposition format (version 0.0.4, as prometheus.io's "Exposition formats"
// page defines it): read into samples, or into families (a `# TYPE` line and the samples under
// it), and written back. What the router reads from an OpenAI upstream's /metrics and from its
// workers' (the vllm:* families it serves summed).
//
//   ASSIGN_OR_RETURN(std::vector<Sample> samples, ParsePrometheusText(body));
//   ASSIGN_OR_RETURN(std::vector<MetricFamily> families, ParsePrometheusFamilies(body));
//   std::string text = WritePrometheusText(families);
//
// Pure functions; safe from any thread.
#ifndef KVSERVE_COMMON_NET_PROMETHEUS_TEXT_H_
#define KVSERVE_COMMON_NET_PROMETHEUS_TEXT_H_

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace kvserve {

struct Sample {
  std::string name;
  std::vector<std::pair<std::string, std::string>> labels;  // as written, escapes undone
  double value = 0;

  [[nodiscard]] const std::string* label(std::string_view key) const;
};

// Every sample line of `text` (comments and blank lines skipped; a timestamp after the value
// ignored). InvalidArgument naming the line for one that does not parse; at most `max_samples`
// samples (a hostile endpoint cannot make the reader hold more).
absl::StatusOr<std::vector<Sample>> ParsePrometheusText(std::string_view text,
                                                        size_t max_samples = 100000);

struct MetricFamily {
  std::string name;
  std::string type = "untyped";  // counter, gauge, histogram, summary or untyped
  std::string help;              // as written (its escapes kept)
  std::vector<Sample> samples;
};

// The families of `text` in the order met. A sample belongs to the family named by the last
// `# TYPE` or `# HELP` line when its name is that name or it with a suffix of the family's
// series (_total, _created, _bucket, _sum, _count, _info; a family named with _total has its
// _created too); any other sample starts an untyped family of its own name. The same errors and
// limit as ParsePrometheusText.
absl::StatusOr<std::vector<MetricFamily>> ParsePrometheusFamilies(std::string_view text,
                                                                  size_t max_samples = 100000);

// `families` in the text format: each one's HELP (when it has one) and TYPE, then its samples;
// label values escaped, values as short as they read back exactly.
std::string WritePrometheusText(const std::vector<MetricFamily>& families);

}  // namespace kvserve

#endif  // KVSERVE_COMMON_NET_PROMETHEUS_TEXT_H_
