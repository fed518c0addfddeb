// The OpenAI response shapes a completion writes that are not plain fields: the completions
// (legacy) logprobs lists, tool_calls entries, vLLM's prompt_logprobs, finish_reason, and the
// units they count in.
//
//   LegacyLogprobs lp;  lp.Add(token, logprob, top, offset);  choice["logprobs"] = lp.ToJson();
//   message["tool_calls"] = ToolCallsJson(calls, 0);
//
// Pure functions and plain data; any thread.
#ifndef KVSERVE_FRONTEND_OUTPUT_OPENAI_JSON_H_
#define KVSERVE_FRONTEND_OUTPUT_OPENAI_JSON_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "frontend/output/tool_calls.h"
#include "kvserve/v1/kvserve.pb.h"
#include "nlohmann/json.hpp"

namespace kvserve::frontend {

// Seconds since the Unix epoch (the responses' "created").
int64_t UnixSeconds();

// Characters of UTF-8 text, as Python's len() counts them (vLLM's text_offset unit).
int64_t CodePoints(std::string_view s);

// Logprobs in the completions (legacy) shape: parallel lists.
struct LegacyLogprobs {
  // Insertion-ordered: each position's top_logprobs object keeps the chosen token first.
  nlohmann::ordered_json tokens = nlohmann::ordered_json::array(),
                         token_logprobs = nlohmann::ordered_json::array(),
                         top_logprobs = nlohmann::ordered_json::array(),
                         text_offset = nlohmann::ordered_json::array();

  void Add(const std::string& token, nlohmann::ordered_json logprob, nlohmann::ordered_json top,
           int64_t offset);
  [[nodiscard]] bool empty() const { return tokens.empty(); }
  [[nodiscard]] nlohmann::ordered_json ToJson() const;
};

// null while the choice runs, else the reason.
nlohmann::json FinishReasonJson(const std::string& finish);

// OpenAI's tool_calls entries, the first numbered `first` (streams number a choice's calls).
nlohmann::json ToolCallsJson(const std::vector<ParsedToolCall>& calls, size_t first);

// A log-probability as vLLM writes it: -inf (a token the request's logits adjustments banned)
// as -9999, which JSON can carry.
inline float JsonLogprob(const kvserve::v1::TokenLogprob& t) {
  return std::max(t.logprob(), -9999.0f);
}

// vLLM's prompt_logprobs: null for the first token, then per token {id: {logprob, rank,
// decoded_token}} holding the prompt token and at most `wanted` top alternatives (-1: all that
// came).
nlohmann::json PromptLogprobsJson(const std::vector<kvserve::v1::PositionLogprobs>& positions,
                                  int wanted, const std::function<std::string(int)>& token_text);

}  // namespace kvserve::frontend

#endif  // KVSERVE_FRONTEND_OUTPUT_OPENAI_JSON_H_
