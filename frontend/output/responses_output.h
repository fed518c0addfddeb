// The Responses API's answer (POST /v1/responses) built from a chat completion's output: its
// reasoning, text (with logprobs) and tool calls become output items (reasoning, message,
// function_call), whole in a response object or streamed as OpenAI's typed events
// (response.created, response.output_item.added, response.output_text.delta, ...,
// response.completed), each with its sequence_number.
//
// How a Completion uses it: frontend/output/api_output.h.
//
// Owned by one Completion, used on its strand.
#ifndef KVSERVE_FRONTEND_OUTPUT_RESPONSES_OUTPUT_H_
#define KVSERVE_FRONTEND_OUTPUT_RESPONSES_OUTPUT_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "frontend/output/api_output.h"
#include "frontend/output/tool_calls.h"
#include "nlohmann/json.hpp"

namespace kvserve::frontend {

class ResponsesOutput final : public ApiOutput {
 public:
  // `echo`: the request's fields the response repeats (ResponsesRequest::echo); `logprobs`:
  // output_text parts carry their tokens' logprobs.
  ResponsesOutput(nlohmann::json echo, bool logprobs)
      : echo_(std::move(echo)), logprobs_(logprobs) {}
  // Called with the final response object (completed or incomplete, whole or streamed) as it is
  // answered: the handler stores it (store true).
  void set_on_response(std::function<void(const nlohmann::json&)> f) {
    on_response_ = std::move(f);
  }

  // The id is "resp_" and `id`.
  void Begin(std::string id, int64_t created, std::string model) override;
  // response.created and response.in_progress.
  std::string Opening(const ApiUsage& usage) override;
  std::string Delta(const std::string& reasoning, const std::string& text,
                    const nlohmann::json& logprobs,
                    const std::vector<ParsedToolCall>& calls) override;
  // The events that close the open item and end the response (response.completed, or
  // response.incomplete when the reason is "length").
  std::string Closing(const ApiFinish& finish, const ApiUsage& usage) override;
  nlohmann::json Response(const ApiFinish& finish, const ApiUsage& usage) override;
  // response.failed with the error's message and code.
  std::string Failed(const OpenAiError& error) override;

 private:
  enum class Kind { kReasoning, kMessage, kCall };
  struct Item {
    Kind kind;
    std::string id;
    std::string text;  // reasoning or output text; a call's arguments
    nlohmann::json logprobs = nlohmann::json::array();
    std::string call_id, name;
    bool done = false;
    bool cut = false;  // a message the budget ended: "incomplete", as OpenAI marks it
  };

  void Emit(nlohmann::json event);
  [[nodiscard]] nlohmann::json ItemJson(const Item& item, bool added) const;
  [[nodiscard]] nlohmann::json PartJson(const Item& item, bool added) const;
  void Open(Kind kind);  // a new item of `kind`, unless the open one is of it
  void CloseOpen();
  // An answer with no message and no call gets an empty message, so that output_text is "".
  void EnsureAnswer();
  [[nodiscard]] nlohmann::json ResponseJson(const std::string& status, const nlohmann::json& output,
                                            const nlohmann::json& usage) const;
  [[nodiscard]] nlohmann::json OutputJson() const;

  nlohmann::json echo_;
  std::function<void(const nlohmann::json&)> on_response_;
  bool logprobs_ = false;
  std::string id_, model_;
  int64_t created_ = 0;
  std::vector<Item> items_;
  int open_ = -1;  // the item being streamed
  int64_t sequence_ = 0;
  std::string out_;  // the events written since the last call
};

}  // namespace kvserve::frontend

#endif  // KVSERVE_FRONTEND_OUTPUT_RESPONSES_OUTPUT_H_
