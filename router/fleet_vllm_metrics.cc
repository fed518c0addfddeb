// The workers' vllm:* families read and merged (fleet_vllm_metrics.h).
#include "router/fleet_vllm_metrics.h"

#include <algorithm>
#include <atomic>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "boost/beast/http/verb.hpp"
#include "common/net/http_client.h"
#include "glog/logging.h"

namespace kvserve::router {
namespace {

constexpr int kParallelReads = 16;
// A worker's /metrics holds a few thousand samples in some hundred kB; more is not a worker's.
constexpr size_t kMaxSamplesPerWorker = 200000;
constexpr uint64_t kMaxBodyBytes = 32 << 20;

enum class Combine { kSum, kMean, kMax, kMin };

Combine CombineOf(const MetricFamily& f, const Sample& s) {
  if (s.name.ends_with("_created")) return Combine::kMin;
  if (f.type != "gauge") return Combine::kSum;
  if (f.name.ends_with("_perc")) return Combine::kMean;
  if (f.name.ends_with("_info")) return Combine::kMax;
  return Combine::kSum;
}

// One merged family: its series by key, each with how many sources it combines.
struct Merged {
  MetricFamily family;
  absl::flat_hash_map<std::string, size_t> index;  // series key -> samples[i]
  std::vector<int> count;
};

// The same name and label set, whatever order the labels were written in.
std::string SeriesKey(const Sample& s) {
  std::vector<std::pair<std::string, std::string>> labels = s.labels;
  std::sort(labels.begin(), labels.end());
  std::string key = s.name;
  for (const auto& [k, v] : labels) absl::StrAppend(&key, "\x1f", k, "\x1e", v);
  return key;
}

void AddSample(Merged& m, Sample s) {
  std::erase_if(s.labels, [](const auto& l) { return l.first == "worker" || l.first == "engine"; });
  const Combine how = CombineOf(m.family, s);
  const auto [it, added] = m.index.try_emplace(SeriesKey(s), m.family.samples.size());
  if (added) {
    m.family.samples.push_back(std::move(s));
    m.count.push_back(1);
    return;
  }
  double& to = m.family.samples[it->second].value;
  ++m.count[it->second];
  switch (how) {
    case Combine::kSum:
    case Combine::kMean:
      to += s.value;
      break;
    case Combine::kMax:
      to = std::max(to, s.value);
      break;
    case Combine::kMin:
      to = std::min(to, s.value);
      break;
  }
}

}  // namespace

std::vector<MetricFamily> MergeVllmFamilies(const std::vector<std::vector<MetricFamily>>& sources) {
  std::vector<Merged> merged;
  absl::flat_hash_map<std::string, size_t> by_name;
  for (const std::vector<MetricFamily>& families : sources) {
    for (const MetricFamily& f : families) {
      if (!f.name.starts_with("vllm:")) continue;
      const auto [it, added] = by_name.try_emplace(f.name, merged.size());
      if (added) {
        merged.push_back({.family = {.name = f.name, .type = f.type, .help = f.help}});
      }
      Merged& m = merged[it->second];
      for (const Sample& s : f.samples) {
        if (f.type == "summary" && s.label("quantile") != nullptr) continue;
        AddSample(m, s);
      }
    }
  }
  std::vector<MetricFamily> out;
  out.reserve(merged.size());
  for (Merged& m : merged) {
    for (size_t i = 0; i < m.family.samples.size(); ++i) {
      if (CombineOf(m.family, m.family.samples[i]) == Combine::kMean) {
        m.family.samples[i].value /= m.count[i];
      }
    }
    out.push_back(std::move(m.family));
  }
  return out;
}

std::string ReadFleetVllmMetrics(const std::vector<MetricsTarget>& targets,
                                 absl::Duration timeout) {
  std::vector<std::vector<MetricFamily>> sources(targets.size());
  std::vector<char> read(targets.size(), 0);
  std::atomic<size_t> next{0};
  auto reader = [&] {
    for (size_t i; (i = next.fetch_add(1)) < targets.size();) {
      const std::string& e = targets[i].endpoint;
      const size_t colon = e.rfind(':');
      if (colon == std::string::npos) continue;
      std::string host = e.substr(0, colon);
      if (host.size() > 1 && host.front() == '[' && host.back() == ']') {
        host = host.substr(1, host.size() - 2);
      }
      absl::StatusOr<std::string> text =
          Fetch({.host = host, .port = e.substr(colon + 1)}, boost::beast::http::verb::get,
                "/metrics", "",
                {.io_timeout_ms = static_cast<int>(absl::ToInt64Milliseconds(timeout)),
                 .max_body_bytes = kMaxBodyBytes});
      absl::StatusOr<std::vector<MetricFamily>> families =
          text.ok() ? ParsePrometheusFamilies(*text, kMaxSamplesPerWorker)
                    : absl::StatusOr<std::vector<MetricFamily>>(text.status());
      if (!families.ok()) {
        LOG_EVERY_T(WARNING, 10) << "kvserve-router: /metrics of worker " << targets[i].worker
                                 << " at " << e << " not read: " << families.status();
        continue;
      }
      sources[i] = *std::move(families);
      read[i] = 1;
    }
  };
  std::vector<std::thread> threads;
  const int n = std::min<int>(kParallelReads, static_cast<int>(targets.size()));
  for (int t = 1; t < n; ++t) threads.emplace_back(reader);
  reader();
  for (std::thread& t : threads) t.join();
  const int ok = static_cast<int>(std::count(read.begin(), read.end(), 1));
  std::string text = WritePrometheusText(MergeVllmFamilies(sources));
  absl::StrAppend(&text,
                  "# HELP kvserve_router_vllm_metrics_sources Workers whose /metrics the vllm:* "
                  "families above sum, at this read (read) and those that failed it (failed).\n"
                  "# TYPE kvserve_router_vllm_metrics_sources gauge\n",
                  "kvserve_router_vllm_metrics_sources{result=\"read\"} ", ok, "\n",
                  "kvserve_router_vllm_metrics_sources{result=\"failed\"} ",
                  static_cast<int>(targets.size()) - ok, "\n");
  return text;
}

}  // namespace kvserve::router
