// An answer shaped for an API other than chat completions, built from a chat completion's
// output: the Responses API (frontend/output/responses_output.h) and Anthropic's Messages API
// (frontend/output/messages_output.h). A Completion with one writes its stream and its final body
// through it instead of chat's chunks:
//
//   out->Begin(id, created, model);
//   conn.Write(out->Opening(usage));                          // streams only
//   conn.Write(out->Delta(reasoning, text, logprobs, calls));  // per chat delta
//   conn.Write(out->Closing(finish, usage));                   // streams: the last events
//   body = out->Response(finish, usage);                       // whole: after one Delta of it all
//
// Owned by one Completion, used on its strand.
#ifndef KVSERVE_FRONTEND_OUTPUT_API_OUTPUT_H_
#define KVSERVE_FRONTEND_OUTPUT_API_OUTPUT_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "frontend/output/openai_error.h"
#include "frontend/output/tool_calls.h"
#include "nlohmann/json.hpp"

namespace kvserve::frontend {

struct ApiUsage {
  int input = 0, cached = 0, output = 0, reasoning = 0;  // cached: of input
};

// How the choice ended: chat's finish_reason ("stop", "length", "tool_calls"), and the stop
// string that matched, if one did.
struct ApiFinish {
  std::string reason;
  std::string stop_string;
};

class ApiOutput {
 public:
  virtual ~ApiOutput() = default;
  // `id`: the router's unique part of the answer's id (each API adds its prefix).
  virtual void Begin(std::string id, int64_t created, std::string model) = 0;
  // The events that open a stream; `usage`: the prompt's tokens.
  virtual std::string Opening(const ApiUsage& usage) = 0;
  // The events of what one chat delta adds: reasoning text, content text with its logprobs
  // entries (chat's shape: token, logprob, bytes, top_logprobs), completed tool calls.
  virtual std::string Delta(const std::string& reasoning, const std::string& text,
                            const nlohmann::json& logprobs,
                            const std::vector<ParsedToolCall>& calls) = 0;
  // The events that end a stream.
  virtual std::string Closing(const ApiFinish& finish, const ApiUsage& usage) = 0;
  // The whole answer; after the output went through Delta.
  virtual nlohmann::json Response(const ApiFinish& finish, const ApiUsage& usage) = 0;
  // The events of a stream that fails after it started.
  virtual std::string Failed(const OpenAiError& error) = 0;
  // An error answered before any stream, in this API's shape.
  [[nodiscard]] virtual OpenAiError Error(const OpenAiError& error) const { return error; }
};

}  // namespace kvserve::frontend

#endif  // KVSERVE_FRONTEND_OUTPUT_API_OUTPUT_H_
