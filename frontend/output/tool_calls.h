// Tool calling (OpenAI's tools and tool_choice) in the front end: what a request asks for, the
// JSON schema that enforces tool_choice "required" or a named function, and the splitter that
// turns a chat output into content and tool calls (docs/STRUCTURED_OUTPUTS.md).
//
// Output formats, as vLLM reads them:
//   - tool_choice "required": a JSON array of {"name": ..., "parameters": {...}} (one entry
//     when parallel_tool_calls is false); a named function: its arguments object alone. Both
//     are constrained with the tools' schemas, so they parse.
//   - tool_choice "auto" (--enable-auto-tool-choice): the model's own format, read by the
//     --tool-call-parser: `hermes` (Qwen, Hermes: `<tool_call>\n{"name": ..., "arguments":
//     ...}\n</tool_call>` blocks after any content) or `llama3_json` (Llama 3.1+: the output is
//     `{"name": ..., "parameters": ...}` objects joined by `;`, after an optional
//     <|python_tag|>). Anything else, a call that does not parse, or one naming no tool of
//     the request, is content.
//
//   ToolCallSplitter split(ToolOutput::kHermes, "");
//   ToolCallSplitter::Parts p = split.Append(text_piece);   // content so far, calls closed
//   p = split.Finish();                                       // the rest
//
// A splitter is one choice's; not thread-safe. The free functions are pure; any thread.
#ifndef KVSERVE_FRONTEND_OUTPUT_TOOL_CALLS_H_
#define KVSERVE_FRONTEND_OUTPUT_TOOL_CALLS_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace kvserve::frontend {

enum class ToolChoice { kNone, kAuto, kRequired, kNamed };

// One entry of `tools`.
struct ToolSpec {
  std::string name;
  std::string definition;  // the tool object as sent (JSON, its keys in their order)
  std::string parameters;  // its parameters schema (JSON), empty when not given
};

// What a chat request asks of tools.
struct ToolRequest {
  std::vector<ToolSpec> tools;
  ToolChoice choice = ToolChoice::kNone;
  std::string name;  // kNamed: the function
  bool parallel = true;
};

// How a choice's output carries its calls.
enum class ToolOutput { kHermes, kLlama3Json, kRequiredArray, kNamedArguments };

// The output format of a --tool-call-parser name (hermes, llama3_json); InvalidArgument for
// another.
absl::StatusOr<ToolOutput> ToolParserFor(std::string_view parser);

// The JSON schema that tool_choice kRequired or kNamed holds the output to (the tools'
// parameters inside it, their local $refs moved to where they are placed); empty for kNone and
// kAuto. InvalidArgument naming the parameter for an unknown name or a schema nested too deep.
absl::StatusOr<std::string> ToolChoiceSchema(const ToolRequest& request);

struct ParsedToolCall {
  std::string id;  // call_ and 24 random letters and digits
  std::string name;
  std::string arguments;  // a JSON text, written as Python's json.dumps writes it (vLLM's)
};

class ToolCallSplitter {
 public:
  struct Parts {
    std::string content;
    std::vector<ParsedToolCall> calls;
  };

  // `name`: the function of kNamedArguments; `names`: the request's tools (the parsers of
  // kHermes and kLlama3Json take calls of these only; empty: of any name).
  ToolCallSplitter(ToolOutput format, std::string name, std::vector<std::string> names = {});

  Parts Append(std::string_view text);
  Parts Finish();

 private:
  enum class State { kStart, kContent, kCall, kWhole };
  void Drain(Parts& out, bool final);
  // Hermes: the calls in `pending_`, content before them.
  void DrainHermes(Parts& out, bool final);
  // The whole output as calls of the format, or as content if it does not parse.
  void ParseWhole(Parts& out);

  ToolOutput format_;
  std::string name_;
  std::vector<std::string> names_;
  State state_ = State::kStart;
  std::string pending_;  // text not yet placed
  std::string between_;  // Hermes: text after a call, content unless only whitespace
  bool called_ = false;  // Hermes: a call was made
};

}  // namespace kvserve::frontend

#endif  // KVSERVE_FRONTEND_OUTPUT_TOOL_CALLS_H_
