// A choice's generated text on its way to the client, as a pipeline of stream stages: stop
// strings, then the reasoning block (a --reasoning-parser), then tool calls (chat with tools).
// Each stage takes the text the one before passed on, keeps back what it cannot place yet, and
// adds its own products (reasoning_content, tool calls, the stop) to the step's OutputDelta.
// Stages compose: a request uses those its parameters need, in that order.
//
//   OutputPipeline out;
//   out.Add(StopStringStage({"###"}, /*include_stop_str=*/false));
//   out.Add(ReasoningStage(tags, /*inside=*/false));
//   OutputDelta d;
//   out.Push(piece, {.check_stops = tokens >= min_tokens}, d);   // per detokenized piece
//   if (d.stopped) ... the choice ends; d.text, d.reasoning, d.calls go to the client
//   out.Push(detokenizer.Finish(), {.final = true}, d);          // the worker ended it
//
// One pipeline per choice; not thread-safe (a completion's strand runs it). Input must be whole
// UTF-8 characters (what IncrementalDetokenizer produces).
#ifndef KVSERVE_FRONTEND_OUTPUT_OUTPUT_PIPELINE_H_
#define KVSERVE_FRONTEND_OUTPUT_OUTPUT_PIPELINE_H_

#include <memory>
#include <string>
#include <vector>

#include "frontend/output/reasoning.h"
#include "frontend/output/tool_calls.h"

namespace kvserve::frontend {

// What a step of a choice's output produced, as it leaves the pipeline.
struct OutputDelta {
  std::string text;                   // content for the client
  std::string reasoning;              // reasoning_content
  std::vector<ParsedToolCall> calls;  // tool calls completed
  bool stopped = false;               // a stop string matched: the choice ends here
  std::string stop_string;            // the one that matched
};

// Where a piece of text stands in its choice's stream.
struct StreamPosition {
  bool final = false;       // nothing follows: every stage gives up what it held back
  bool check_stops = true;  // stop strings apply (vLLM: from the min_tokens-th token on)
};

class OutputStage {
 public:
  virtual ~OutputStage() = default;
  // Takes `text` from the stage before; returns what passes on to the next; adds this stage's
  // own products to `out`.
  virtual std::string Process(std::string text, const StreamPosition& at, OutputDelta& out) = 0;
};

class OutputPipeline {
 public:
  void Add(std::unique_ptr<OutputStage> stage) { stages_.push_back(std::move(stage)); }
  // `text` through every stage in order; once one stops the stream, those after it see the
  // text as final. What the last stage passes on is appended to out.text.
  void Push(std::string text, StreamPosition at, OutputDelta& out);

 private:
  std::vector<std::unique_ptr<OutputStage>> stages_;
};

// Stop strings (frontend/output/stop_strings.h): text that may still start one is held back; on a
// match the text ends before it (with it, `include_stop_str`) and out.stopped is set.
std::unique_ptr<OutputStage> StopStringStage(std::vector<std::string> stops, bool include_stop_str);
// The reasoning block (frontend/output/reasoning.h) to out.reasoning; the rest passes on.
std::unique_ptr<OutputStage> ReasoningStage(const ReasoningTags& tags, bool inside);
// Tool calls (frontend/output/tool_calls.h) to out.calls; the content around them passes on.
std::unique_ptr<OutputStage> ToolCallStage(ToolOutput format, std::string name,
                                           std::vector<std::string> names);

}  // namespace kvserve::frontend

#endif  // KVSERVE_FRONTEND_OUTPUT_OUTPUT_PIPELINE_H_
