// Anthropic's Messages API request (POST /v1/messages), as vLLM serves it, written as the chat
// completion request that asks the same of the model: `system` and `messages` (text, tool_use,
// tool_result and thinking blocks) become chat messages, `tools` (`input_schema`) and
// `tool_choice` (auto, any, tool, none) chat's, `stop_sequences` stop, `thinking.type: disabled`
// the template's enable_thinking false. What kvserve does not serve is a 400 naming it: server
// tools, image and document blocks, a thinking budget, MCP servers, containers.
//
//   ASSIGN_OR_RETURN(MessagesRequest r, TranslateMessagesRequest(body, limits));
//   ASSIGN_OR_RETURN(ParsedRequest parsed, ParseMessagesAsChat(r, limits));
//
// Pure functions; any thread. The body is untrusted.
#ifndef KVSERVE_FRONTEND_REQUEST_MESSAGES_REQUEST_H_
#define KVSERVE_FRONTEND_REQUEST_MESSAGES_REQUEST_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "frontend/request/parsed_request.h"

namespace kvserve::frontend {

struct MessagesRequest {
  std::string chat_body;  // the /v1/chat/completions body that asks the same
  // Per message of chat_body, the Messages parameter it came from ("system", "messages[2]").
  std::vector<std::string> message_origin;
  // Where a structured output's schema came from: "output_config.format" or "output_format".
  std::string format_param = "output_config.format";
};

// InvalidArgument "param: what is wrong" for a bad or unserved field. `counting`: a
// /v1/messages/count_tokens body, which has no max_tokens.
absl::StatusOr<MessagesRequest> TranslateMessagesRequest(std::string_view body,
                                                         const RequestLimits& limits,
                                                         bool counting = false);

// An error message about the chat request ("messages[3].content: ...") as the Messages API
// names its fields ("messages[1].content: ...", stop to stop_sequences, tools[i].function to
// tools[i], tools[i].function.parameters to tools[i].input_schema).
std::string RenameMessagesParam(std::string_view message, const MessagesRequest& r);

// ParseCompletionRequest of the translated chat body, its errors renamed.
absl::StatusOr<ParsedRequest> ParseMessagesAsChat(const MessagesRequest& r,
                                                  const RequestLimits& limits);

}  // namespace kvserve::frontend

#endif  // KVSERVE_FRONTEND_REQUEST_MESSAGES_REQUEST_H_
