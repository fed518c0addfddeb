// The OpenAI request parser (router/openai_request.h) on arbitrary bodies: the first byte picks
// /v1/completions or /v1/chat/completions. Any body gets a request or an InvalidArgument; a
// parsed request passes the logprob budget check without overflow. The body is also read as a
// chat output by each tool-call splitter, cut into pieces of 1 to 8 bytes, and as a Responses
// API and an Anthropic Messages body (router/responses_request.h, router/messages_request.h):
// a chat request or an InvalidArgument, never a crash.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "router/messages_request.h"
#include "router/openai_request.h"
#include "router/responses_request.h"
#include "router/tool_calls.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool chat = data[0] & 1;
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  kvserve::router::RequestLimits limits;
  limits.max_prompt_bytes = 1 << 16;
  limits.max_prompt_ids = 4096;
  absl::StatusOr<kvserve::router::ParsedRequest> r =
      kvserve::router::ParseCompletionRequest(body, chat, limits);
  if (r.ok()) {
    kvserve::router::CheckLogprobBudget(*r, r->max_tokens, limits).IgnoreError();
  }
  absl::StatusOr<kvserve::router::ResponsesRequest> responses =
      kvserve::router::TranslateResponsesRequest(body, limits);
  if (responses.ok()) kvserve::router::ParseResponsesAsChat(*responses, limits).IgnoreError();
  absl::StatusOr<kvserve::router::MessagesRequest> messages =
      kvserve::router::TranslateMessagesRequest(body, limits, /*counting=*/data[0] & 2);
  if (messages.ok()) kvserve::router::ParseMessagesAsChat(*messages, limits).IgnoreError();
  using kvserve::router::ToolOutput;
  const size_t step = 1 + (data[0] >> 1) % 8;
  for (ToolOutput format : {ToolOutput::kHermes, ToolOutput::kLlama3Json,
                            ToolOutput::kRequiredArray, ToolOutput::kNamedArguments}) {
    kvserve::router::ToolCallSplitter split(format, "f");
    for (size_t i = 0; i < body.size(); i += step) split.Append(body.substr(i, step));
    split.Finish();
  }
  return 0;
}
