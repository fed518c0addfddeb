#include "frontend/output/openai_json.h"

#include <chrono>
#include <utility>

namespace kvserve::frontend {

using json = nlohmann::json;
namespace pb = ::kvserve::v1;

int64_t UnixSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

int64_t CodePoints(std::string_view s) {
  int64_t n = 0;
  for (char ch : s) n += (static_cast<unsigned char>(ch) & 0xC0) != 0x80 ? 1 : 0;
  return n;
}

void LegacyLogprobs::Add(const std::string& token, nlohmann::ordered_json logprob,
                         nlohmann::ordered_json top, int64_t offset) {
  tokens.push_back(token);
  token_logprobs.push_back(std::move(logprob));
  top_logprobs.push_back(std::move(top));
  text_offset.push_back(offset);
}

nlohmann::ordered_json LegacyLogprobs::ToJson() const {
  return {{"tokens", tokens},
          {"token_logprobs", token_logprobs},
          {"top_logprobs", top_logprobs},
          {"text_offset", text_offset}};
}

json FinishReasonJson(const std::string& finish) {
  return finish.empty() ? json(nullptr) : json(finish);
}

json ToolCallsJson(const std::vector<ParsedToolCall>& calls, size_t first) {
  json out = json::array();
  for (size_t k = 0; k < calls.size(); ++k) {
    out.push_back({{"index", first + k},
                   {"id", calls[k].id},
                   {"type", "function"},
                   {"function", {{"name", calls[k].name}, {"arguments", calls[k].arguments}}}});
  }
  return out;
}

json PromptLogprobsJson(const std::vector<pb::PositionLogprobs>& positions, int wanted,
                        const std::function<std::string(int)>& token_text) {
  json out = json::array({nullptr});
  for (const pb::PositionLogprobs& lp : positions) {
    json position = json::object();
    int rank = 1;
    for (const pb::TokenLogprob& t : lp.top()) {
      if (wanted >= 0 && rank > wanted) break;
      position[std::to_string(t.token_id())] = {{"logprob", JsonLogprob(t)},
                                                {"rank", rank++},
                                                {"decoded_token", token_text(t.token_id())}};
    }
    position[std::to_string(lp.sampled().token_id())] = {
        {"logprob", JsonLogprob(lp.sampled())},
        {"rank", lp.rank()},
        {"decoded_token", token_text(lp.sampled().token_id())}};
    out.push_back(std::move(position));
  }
  return out;
}

}  // namespace kvserve::frontend
