#include "tools/trace/trace.h"

#include <algorithm>
#include <fstream>
#include <random>
#include <sstream>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace kvserve::trace {
namespace {

using json = nlohmann::json;

// SplitMix64: a block's ids from its hash id and position, the same in every run and build.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

absl::StatusOr<int64_t> Integer(const json& j, const char* field, const std::string& where) {
  if (!j.contains(field))
    return absl::InvalidArgumentError(absl::StrCat(where, ": no \"", field, "\""));
  const json& v = j[field];
  if (!v.is_number_integer() || v.get<int64_t>() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": \"", field, "\" must be an integer >= 0, got ", v.dump()));
  }
  return v.get<int64_t>();
}

absl::StatusOr<TraceRequest> ParseLine(std::string_view line, const std::string& where,
                                       int block_size) {
  json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return absl::InvalidArgumentError(absl::StrCat(where, ": not a JSON object"));
  TraceRequest r;
  ASSIGN_OR_RETURN(r.timestamp_ms, Integer(j, "timestamp", where));
  ASSIGN_OR_RETURN(r.input_length, Integer(j, "input_length", where));
  ASSIGN_OR_RETURN(r.output_length, Integer(j, "output_length", where));
  if (!j.contains("hash_ids") || !j["hash_ids"].is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": \"hash_ids\" must be an array"));
  }
  for (const json& h : j["hash_ids"]) {
    if (!h.is_number_integer()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": \"hash_ids\" holds ", h.dump(), ", not an integer"));
    }
    r.hash_ids.push_back(h.get<int64_t>());
  }
  const int64_t want = (r.input_length + block_size - 1) / block_size;
  if (static_cast<int64_t>(r.hash_ids.size()) != want) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": ", r.hash_ids.size(), " hash_ids for input_length ", r.input_length,
                     " (blocks of ", block_size, " tokens need ", want, ")"));
  }
  return r;
}

}  // namespace

absl::StatusOr<std::vector<TraceRequest>> ParseTrace(std::string_view text, std::string_view source,
                                                     int block_size) {
  if (block_size < 1) return absl::InvalidArgumentError("the trace's block size must be >= 1");
  std::vector<TraceRequest> out;
  size_t start = 0;
  for (int line_no = 1; start < text.size(); ++line_no) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = text.substr(start, end - start);
    start = end + 1;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    const std::string where = absl::StrCat(std::string(source), ":", line_no);
    ASSIGN_OR_RETURN(TraceRequest r, ParseLine(line, where, block_size));
    if (!out.empty() && r.timestamp_ms < out.back().timestamp_ms) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": timestamp ", r.timestamp_ms,
                                                     " is before the previous line's ",
                                                     out.back().timestamp_ms));
    }
    out.push_back(std::move(r));
  }
  return out;
}

absl::StatusOr<std::vector<TraceRequest>> ReadTrace(const std::string& path, int block_size) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read the trace ", path));
  std::stringstream text;
  text << in.rdbuf();
  return ParseTrace(text.str(), path, block_size);
}

std::string FormatTraceLine(const TraceRequest& r) {
  json j;
  j["timestamp"] = r.timestamp_ms;
  j["input_length"] = r.input_length;
  j["output_length"] = r.output_length;
  j["hash_ids"] = r.hash_ids;
  return j.dump();
}

std::vector<int32_t> TracePrompt(const TraceRequest& r, const PromptOptions& o) {
  std::vector<int32_t> ids;
  ids.reserve(r.input_length);
  const uint64_t range = static_cast<uint64_t>(o.max_token - o.min_token);
  for (size_t b = 0; b < r.hash_ids.size(); ++b) {
    const uint64_t seed = Mix(static_cast<uint64_t>(r.hash_ids[b]));
    for (int i = 0; i < o.block_size && static_cast<int64_t>(ids.size()) < r.input_length; ++i) {
      ids.push_back(o.min_token + static_cast<int32_t>(Mix(seed + i) % range));
    }
  }
  return ids;
}

std::vector<TraceRequest> Window(const std::vector<TraceRequest>& trace, int64_t start_ms,
                                 int64_t end_ms) {
  std::vector<TraceRequest> out;
  for (const TraceRequest& r : trace) {
    if (r.timestamp_ms >= start_ms && r.timestamp_ms < end_ms) out.push_back(r);
  }
  return out;
}

std::vector<TraceRequest> SpreadArrivals(std::vector<TraceRequest> trace, int64_t max_spread_ms,
                                         uint64_t seed) {
  std::mt19937_64 rng(seed);
  int64_t last_gap = 0;
  for (size_t first = 0; first < trace.size();) {
    size_t end = first;
    while (end < trace.size() && trace[end].timestamp_ms == trace[first].timestamp_ms) ++end;
    if (end < trace.size()) last_gap = trace[end].timestamp_ms - trace[first].timestamp_ms;
    const int64_t spread = std::min(last_gap, max_spread_ms);
    std::vector<int64_t> offsets(end - first);
    std::uniform_int_distribution<int64_t> offset(0, std::max<int64_t>(spread - 1, 0));
    for (int64_t& o : offsets) o = offset(rng);
    std::sort(offsets.begin(), offsets.end());
    for (size_t i = first; i < end; ++i) trace[i].timestamp_ms += offsets[i - first];
    first = end;
  }
  return trace;
}

int64_t UniqueTokens(const std::vector<TraceRequest>& trace, int block_size) {
  absl::flat_hash_set<int64_t> ids;
  for (const TraceRequest& r : trace) ids.insert(r.hash_ids.begin(), r.hash_ids.end());
  return static_cast<int64_t>(ids.size()) * block_size;
}

}  // namespace kvserve::trace
