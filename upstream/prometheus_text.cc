// Prometheus text format 0.0.4 read into samples; vLLM's load from them (prometheus_text.h).
#include "upstream/prometheus_text.h"

#include <cctype>
#include <cmath>
#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace kvserve::upstream {
namespace {

bool NameChar(char c, bool first) {
  return std::isalpha(static_cast<unsigned char>(c)) || c == '_' || c == ':' ||
         (!first && std::isdigit(static_cast<unsigned char>(c)));
}

// A name at the front of `s`, consumed; empty if none.
std::string TakeName(absl::string_view& s) {
  size_t n = 0;
  while (n < s.size() && NameChar(s[n], n == 0)) ++n;
  std::string name(s.substr(0, n));
  s.remove_prefix(n);
  return name;
}

// `{k="v",...}` at the front of `s`, consumed; false when malformed.
bool TakeLabels(absl::string_view& s, std::vector<std::pair<std::string, std::string>>& labels) {
  if (!absl::ConsumePrefix(&s, "{")) return true;
  for (;;) {
    s = absl::StripLeadingAsciiWhitespace(s);
    if (absl::ConsumePrefix(&s, "}")) return true;
    std::string key = TakeName(s);
    if (key.empty() || !absl::ConsumePrefix(&s, "=\"")) return false;
    std::string value;
    for (;;) {
      if (s.empty()) return false;
      const char c = s.front();
      s.remove_prefix(1);
      if (c == '"') break;
      if (c != '\\') {
        value += c;
        continue;
      }
      if (s.empty()) return false;
      const char e = s.front();
      s.remove_prefix(1);
      value += e == 'n' ? '\n' : e;  // \\ and \" stand for themselves
    }
    labels.emplace_back(std::move(key), std::move(value));
    s = absl::StripLeadingAsciiWhitespace(s);
    if (!absl::ConsumePrefix(&s, ",") && (s.empty() || s.front() != '}')) return false;
  }
}

bool ParseValue(absl::string_view v, double* out) {
  if (v == "+Inf" || v == "Inf") return *out = INFINITY, true;
  if (v == "-Inf") return *out = -INFINITY, true;
  if (v == "NaN") return *out = NAN, true;
  return absl::SimpleAtod(v, out);
}

}  // namespace

const std::string* Sample::label(std::string_view key) const {
  for (const auto& [k, v] : labels) {
    if (k == key) return &v;
  }
  return nullptr;
}

absl::StatusOr<std::vector<Sample>> ParsePrometheusText(std::string_view text, size_t max_samples) {
  std::vector<Sample> samples;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(absl::string_view(text.data(), text.size()), '\n')) {
    ++line_no;
    absl::string_view s = absl::StripAsciiWhitespace(line);
    if (s.empty() || s.front() == '#') continue;
    Sample sample;
    sample.name = TakeName(s);
    std::vector<absl::string_view> rest;
    if (!sample.name.empty() && TakeLabels(s, sample.labels)) {
      rest = absl::StrSplit(absl::StripLeadingAsciiWhitespace(s), ' ', absl::SkipEmpty());
    }
    if (sample.name.empty() || rest.empty() || rest.size() > 2 ||
        !ParseValue(rest[0], &sample.value)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "metrics line ", line_no, " is not a Prometheus sample: '", line.substr(0, 120), "'"));
    }
    if (samples.size() == max_samples) {
      return absl::InvalidArgumentError(absl::StrCat("metrics: over ", max_samples, " samples"));
    }
    samples.push_back(std::move(sample));
  }
  return samples;
}

UpstreamLoad VllmLoad(const std::vector<Sample>& samples) {
  UpstreamLoad load;
  int usage_engines = 0;
  auto add = [](std::optional<double>& to, double v) { to = to.value_or(0) + v; };
  for (const Sample& s : samples) {
    if (s.name == "vllm:num_requests_running") add(load.running, s.value);
    if (s.name == "vllm:num_requests_waiting") add(load.waiting, s.value);
    if (s.name == "process_start_time_seconds" && !load.start_time) load.start_time = s.value;
    if (s.name == "vllm:kv_cache_usage_perc" || s.name == "vllm:gpu_cache_usage_perc") {
      add(load.kv_usage, s.value);
      ++usage_engines;
    }
    if (s.name == "vllm:cache_config_info") {
      int64_t blocks = 0;
      int block_size = 0;
      if (const std::string* b = s.label("num_gpu_blocks"); b && absl::SimpleAtoi(*b, &blocks)) {
        load.num_gpu_blocks = load.num_gpu_blocks.value_or(0) + blocks;
      }
      if (const std::string* b = s.label("block_size");
          b && !load.block_size && absl::SimpleAtoi(*b, &block_size) && block_size > 0) {
        load.block_size = block_size;
      }
      if (const std::string* d = s.label("cache_dtype"); d && !load.cache_dtype) {
        load.cache_dtype = *d;
      }
    }
  }
  if (usage_engines > 1) *load.kv_usage /= usage_engines;
  return load;
}

}  // namespace kvserve::upstream
