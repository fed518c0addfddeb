// The OpenAI request parser (frontend/request/openai_request.h) on arbitrary bodies: the first byte
// picks /v1/completions or /v1/chat/completions. Any body gets a request or an InvalidArgument; a
// parsed request passes the logprob budget check without overflow. The body is also read as a
// chat output by each tool-call splitter, cut into pieces of 1 to 8 bytes, and as a Responses
// API and an Anthropic Messages body (frontend/request/responses_request.h,
// frontend/request/messages_request.h): a chat request or an InvalidArgument, never a crash.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "frontend/output/tool_calls.h"
#include "frontend/request/messages_request.h"
#include "frontend/request/openai_request.h"
#include "frontend/request/responses_request.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool chat = data[0] & 1;
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  kvserve::frontend::RequestLimits limits;
  limits.max_prompt_bytes = 1 << 16;
  limits.max_prompt_ids = 4096;
  absl::StatusOr<kvserve::frontend::ParsedRequest> r =
      kvserve::frontend::ParseCompletionRequest(body, chat, limits);
  if (r.ok()) {
    kvserve::frontend::CheckLogprobBudget(*r, r->max_tokens, limits, 0, 128256).IgnoreError();
  }
  absl::StatusOr<kvserve::frontend::ResponsesRequest> responses =
      kvserve::frontend::TranslateResponsesRequest(body, limits);
  if (responses.ok()) kvserve::frontend::ParseResponsesAsChat(*responses, limits).IgnoreError();
  absl::StatusOr<kvserve::frontend::MessagesRequest> messages =
      kvserve::frontend::TranslateMessagesRequest(body, limits, /*counting=*/data[0] & 2);
  if (messages.ok()) kvserve::frontend::ParseMessagesAsChat(*messages, limits).IgnoreError();
  using kvserve::frontend::ToolOutput;
  const size_t step = 1 + (data[0] >> 1) % 8;
  for (ToolOutput format : {ToolOutput::kHermes, ToolOutput::kLlama3Json,
                            ToolOutput::kRequiredArray, ToolOutput::kNamedArguments}) {
    kvserve::frontend::ToolCallSplitter split(format, "f");
    for (size_t i = 0; i < body.size(); i += step) split.Append(body.substr(i, step));
    split.Finish();
  }
  return 0;
}
