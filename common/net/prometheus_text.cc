// Prometheus text format 0.0.4 read and written (prometheus_text.h).
#include "common/net/prometheus_text.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>

#include "absl/functional/function_ref.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"

namespace kvserve {
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

// Reads `text` line by line: `on_comment` gets each `# HELP` / `# TYPE` line's keyword, name
// and rest; `on_sample` each sample. InvalidArgument naming the first line that does not parse.
absl::Status ReadLines(
    std::string_view text, size_t max_samples,
    absl::FunctionRef<void(absl::string_view, std::string, absl::string_view)> on_comment,
    absl::FunctionRef<void(Sample)> on_sample) {
  int line_no = 0;
  size_t samples = 0;
  for (absl::string_view line : absl::StrSplit(absl::string_view(text.data(), text.size()), '\n')) {
    ++line_no;
    absl::string_view s = absl::StripAsciiWhitespace(line);
    if (s.empty()) continue;
    if (absl::ConsumePrefix(&s, "#")) {
      s = absl::StripLeadingAsciiWhitespace(s);
      for (absl::string_view keyword : {"HELP", "TYPE"}) {
        if (!absl::ConsumePrefix(&s, keyword) || s.empty() || s.front() != ' ') continue;
        s = absl::StripLeadingAsciiWhitespace(s);
        std::string name = TakeName(s);
        if (!name.empty())
          on_comment(keyword, std::move(name), absl::StripLeadingAsciiWhitespace(s));
        break;
      }
      continue;
    }
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
    if (samples++ == max_samples) {
      return absl::InvalidArgumentError(absl::StrCat("metrics: over ", max_samples, " samples"));
    }
    on_sample(std::move(sample));
  }
  return absl::OkStatus();
}

// Whether a sample named `sample` is a series of the family `family` (a counter's family may be
// named with its _total, as prometheus_client writes it, beside its _created).
bool InFamily(std::string_view sample, std::string_view family) {
  if (sample == family) return true;
  if (family.ends_with("_total")) family.remove_suffix(6);
  if (!sample.starts_with(family)) return false;
  const std::string_view suffix = sample.substr(family.size());
  for (std::string_view s : {"", "_total", "_created", "_bucket", "_sum", "_count", "_info"}) {
    if (suffix == s) return true;
  }
  return false;
}

void AppendValue(std::string& out, double v) {
  if (std::isnan(v)) return out.append("NaN"), void();
  if (std::isinf(v)) return out.append(v > 0 ? "+Inf" : "-Inf"), void();
  char buf[64];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  out.append(buf, end);
}

void AppendLabelValue(std::string& out, std::string_view v) {
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
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
  RETURN_IF_ERROR(ReadLines(
      text, max_samples, [](absl::string_view, std::string, absl::string_view) {},
      [&](Sample s) { samples.push_back(std::move(s)); }));
  return samples;
}

absl::StatusOr<std::vector<MetricFamily>> ParsePrometheusFamilies(std::string_view text,
                                                                  size_t max_samples) {
  std::vector<MetricFamily> families;
  auto named = [&](const std::string& name) -> MetricFamily& {
    if (families.empty() || families.back().name != name) families.push_back({.name = name});
    return families.back();
  };
  RETURN_IF_ERROR(ReadLines(
      text, max_samples,
      [&](absl::string_view keyword, std::string name, absl::string_view rest) {
        MetricFamily& f = named(name);
        (keyword == "HELP" ? f.help : f.type) = std::string(rest);
      },
      [&](Sample s) {
        if (families.empty() || !InFamily(s.name, families.back().name)) named(s.name);
        families.back().samples.push_back(std::move(s));
      }));
  return families;
}

std::string WritePrometheusText(const std::vector<MetricFamily>& families) {
  std::string out;
  for (const MetricFamily& f : families) {
    if (!f.help.empty()) absl::StrAppend(&out, "# HELP ", f.name, " ", f.help, "\n");
    absl::StrAppend(&out, "# TYPE ", f.name, " ", f.type, "\n");
    for (const Sample& s : f.samples) {
      out += s.name;
      if (!s.labels.empty()) {
        out += '{';
        for (size_t i = 0; i < s.labels.size(); ++i) {
          absl::StrAppend(&out, i ? "," : "", s.labels[i].first, "=\"");
          AppendLabelValue(out, s.labels[i].second);
          out += '"';
        }
        out += '}';
      }
      out += ' ';
      AppendValue(out, s.value);
      out += '\n';
    }
  }
  return out;
}

}  // namespace kvserve
