// OpenAI's Responses API request (POST /v1/responses) as the chat completion request that asks
// the same of the model: `instructions`, then the stored conversation of `previous_response_id`
// (its input and output items, from the Responses store: frontend/store/response_store.h), then
// `input` (text, or message / function_call / function_call_output / reasoning items) become
// messages, function `tools` and `tool_choice` the chat's, `text.format` the chat's
// response_format, `max_output_tokens` max_tokens. What the response object repeats back
// (instructions, tools, text, store, ...) is kept beside it, and the input as items with ids
// (input_items). A Responses parameter kvserve does not serve is a 400 naming it: conversation,
// background, item references, hosted tools, inputs other than text, reasoning effort and
// summaries, truncation "auto"; store and previous_response_id without a store.
//
//   ASSIGN_OR_RETURN(ResponsesRequest r, TranslateResponsesRequest(body, limits, state));
//   ASSIGN_OR_RETURN(ParsedRequest parsed, ParseResponsesAsChat(r, limits));
//
// Pure functions; any thread. The body is untrusted.
#ifndef KVSERVE_FRONTEND_REQUEST_RESPONSES_REQUEST_H_
#define KVSERVE_FRONTEND_REQUEST_RESPONSES_REQUEST_H_

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "frontend/request/parsed_request.h"
#include "nlohmann/json.hpp"

namespace kvserve::frontend {

struct ResponsesRequest {
  std::string chat_body;  // the /v1/chat/completions body that asks the same
  // Per message of chat_body, the Responses parameter it came from ("instructions", "input",
  // "input[3]"), so that an error about messages[k] names what the client sent.
  std::vector<std::string> message_origin;
  // The request's own fields that the response object repeats (instructions, tools,
  // tool_choice, text, temperature, top_p, max_output_tokens, parallel_tool_calls, metadata,
  // user, reasoning, top_logprobs), in the Responses shapes, defaults filled in.
  nlohmann::json echo;
  bool output_logprobs = false;  // include has "message.output_text.logprobs"
  std::string prompt_cache_key;  // OpenAI's cache-affinity key: kvserve routes by it
  bool store = false;            // keep the response (the store's default: true when there is one)
  std::string previous_response_id;
  // The input as Responses items, each with an id ("msg_...", "fc_...", ...): input_items.
  nlohmann::json input_items = nlohmann::json::array();
  // The previous response's conversation (its input and output items, and those before them).
  nlohmann::json previous_items = nlohmann::json::array();
};

// What the Responses store lends a translation.
struct ResponsesState {
  bool store = false;  // a store is configured: `store` defaults to true, chaining is served
  // The conversation items stored with response `id` (NotFound when there is none for this
  // tenant; Unavailable when the store cannot be reached).
  std::function<absl::StatusOr<nlohmann::json>(const std::string& id)> conversation;
};

// InvalidArgument "param: what is wrong" for a bad or unserved field; NotFound naming
// previous_response_id for a response the store does not hold.
absl::StatusOr<ResponsesRequest> TranslateResponsesRequest(std::string_view body,
                                                           const RequestLimits& limits,
                                                           const ResponsesState& state = {});

// ParseCompletionRequest of the translated chat body, its errors renamed to the Responses
// parameters (messages[k] to input[i], max_tokens to max_output_tokens, response_format to
// text.format, tools[i].function to tools[i]).
absl::StatusOr<ParsedRequest> ParseResponsesAsChat(const ResponsesRequest& r,
                                                   const RequestLimits& limits);

// An error message about the chat request ("messages[2].content: ...") as the Responses
// parameters name it ("input[1].content: ...").
std::string RenameResponsesParam(std::string_view message, const ResponsesRequest& r);

}  // namespace kvserve::frontend

#endif  // KVSERVE_FRONTEND_REQUEST_RESPONSES_REQUEST_H_
