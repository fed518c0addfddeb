// Anthropic's Messages API answer (POST /v1/messages) built from a chat completion's output:
// content blocks thinking (from a reasoning parser), text and tool_use (`input` the call's
// arguments as an object), stop_reason end_turn / max_tokens / stop_sequence (with the string) /
// tool_use, usage with cache_read_input_tokens. Streamed as Anthropic's events: message_start,
// content_block_start / _delta (thinking_delta, text_delta, input_json_delta) / _stop,
// message_delta, message_stop; a failure after the start is an `error` event. Errors before it
// are in Anthropic's shape ({"type": "error", "error": {"type", "message"}}).
//
// How a Completion uses it: frontend/output/api_output.h. Owned by one Completion, used on its
// strand.
#ifndef KVSERVE_FRONTEND_OUTPUT_MESSAGES_OUTPUT_H_
#define KVSERVE_FRONTEND_OUTPUT_MESSAGES_OUTPUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "frontend/output/api_output.h"
#include "nlohmann/json.hpp"

namespace kvserve::frontend {

// An OpenAI-shaped error as Anthropic writes it, same status.
OpenAiError AnthropicError(const OpenAiError& error);

class MessagesOutput final : public ApiOutput {
 public:
  // The id is "msg_" and `id`.
  void Begin(std::string id, int64_t created, std::string model) override;
  std::string Opening(const ApiUsage& usage) override;
  std::string Delta(const std::string& reasoning, const std::string& text,
                    const nlohmann::json& logprobs,
                    const std::vector<ParsedToolCall>& calls) override;
  std::string Closing(const ApiFinish& finish, const ApiUsage& usage) override;
  nlohmann::json Response(const ApiFinish& finish, const ApiUsage& usage) override;
  std::string Failed(const OpenAiError& error) override;
  [[nodiscard]] OpenAiError Error(const OpenAiError& error) const override {
    return AnthropicError(error);
  }

 private:
  enum class Kind { kThinking, kText, kToolUse };
  struct Block {
    Kind kind;
    std::string text;  // thinking or text; a call's arguments (a JSON object's text)
    std::string id, name;
  };

  void Emit(nlohmann::json event);
  void Open(Kind kind);  // a new block of `kind`, unless the open one is of it
  void CloseOpen();
  [[nodiscard]] nlohmann::json BlockJson(const Block& b, bool start) const;
  [[nodiscard]] static nlohmann::json StopReason(const ApiFinish& finish);
  [[nodiscard]] static nlohmann::json UsageJson(const ApiUsage& usage);

  std::string id_, model_;
  std::vector<Block> blocks_;
  int open_ = -1;    // the block being streamed
  std::string out_;  // the events written since the last call
};

}  // namespace kvserve::frontend

#endif  // KVSERVE_FRONTEND_OUTPUT_MESSAGES_OUTPUT_H_
