// Request traces in the Mooncake FAST'25 JSONL format (github.com/kvcache-ai/Mooncake,
// FAST25-release/README.md, as published 2025): one request per line,
//   {"timestamp": ms, "input_length": tokens, "output_length": tokens, "hash_ids": [...]}
// where hash_ids name the prompt's blocks of `block_size` tokens (512 in the published traces):
// equal ids are equal prefix blocks. Prompts are made of token ids derived from the hash ids
// alone, so that requests sharing blocks share those tokens and no text is needed.
//
//   ASSIGN_OR_RETURN(std::vector<TraceRequest> trace, ReadTrace("conversation_trace.jsonl"));
//   std::vector<int32_t> prompt = TracePrompt(trace[0], {.block_size = 512});
//
// Pure functions; any thread.
#ifndef KVSERVE_TOOLS_TRACE_TRACE_H_
#define KVSERVE_TOOLS_TRACE_TRACE_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace kvserve::trace {

struct TraceRequest {
  int64_t timestamp_ms = 0;
  int64_t input_length = 0;
  int64_t output_length = 0;
  std::vector<int64_t> hash_ids;
};

// InvalidArgument naming `source`, the line and the field for a malformed line: not a JSON
// object, a field missing or of the wrong type, negative lengths, timestamps going back, or
// hash ids that do not cover the input in blocks of `block_size` (ceil(input / block) ids).
// Blank lines are skipped.
absl::StatusOr<std::vector<TraceRequest>> ParseTrace(std::string_view text, std::string_view source,
                                                     int block_size = 512);
absl::StatusOr<std::vector<TraceRequest>> ReadTrace(const std::string& path, int block_size = 512);

// One JSONL line (no newline) of `r`.
std::string FormatTraceLine(const TraceRequest& r);

struct PromptOptions {
  int block_size = 512;
  int32_t min_token = 100;  // ids are drawn from [min_token, max_token)
  int32_t max_token = 128000;
};
// The prompt of `r`: block i holds ids that depend only on hash_ids[i] (and the options); the
// last block is cut to input_length.
std::vector<int32_t> TracePrompt(const TraceRequest& r, const PromptOptions& options);

// The requests with start_ms <= timestamp < end_ms, in order.
std::vector<TraceRequest> Window(const std::vector<TraceRequest>& trace, int64_t start_ms,
                                 int64_t end_ms);

// The published traces bin their timestamps (conversation_trace.jsonl: each distinct timestamp
// 2,999-3,001 ms after the one before, ~9 requests at each), so a bin's requests arrived
// somewhere within it, not in one millisecond. Spreads each group of equal timestamps uniformly
// at random over the gap to the next distinct timestamp (the last group over the gap before it;
// at most `max_spread_ms`), keeping the order of the requests; a trace with one timestamp is
// returned as it is. The same `seed` gives the same arrivals.
std::vector<TraceRequest> SpreadArrivals(std::vector<TraceRequest> trace, int64_t max_spread_ms,
                                         uint64_t seed);

// Distinct hash ids in `trace` times block_size: the tokens a cache would need to hold it all.
int64_t UniqueTokens(const std::vector<TraceRequest>& trace, int block_size = 512);

}  // namespace kvserve::trace

#endif  // KVSERVE_TOOLS_TRACE_TRACE_H_
