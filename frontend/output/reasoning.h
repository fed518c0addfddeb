// Reasoning content (vLLM's --reasoning-parser): a chat output's text inside the reasoning
// block (<think> ... </think> for Qwen3 and DeepSeek-R1) goes to `reasoning_content`, the rest
// to `content`. A splitter is fed the output's text as it is decoded and returns what is
// certain so far, holding back the tail that could still be part of a tag.
//
//   ReasoningSplitter split(*ReasoningTagsFor("qwen3"), /*inside=*/false);
//   ReasoningSplitter::Parts p = split.Append("<think>hm</th");   // reasoning "hm"
//   p = split.Append("ink>\n{\"a\": 1}");                          // content "\n{\"a\": 1}"
//   p = split.Finish();                                             // whatever was held back
//
// An output that opens the block and never closes it is reasoning throughout (its end was cut
// off); one that does not start with the start tag is content. Not thread-safe: one choice's.
#ifndef KVSERVE_FRONTEND_OUTPUT_REASONING_H_
#define KVSERVE_FRONTEND_OUTPUT_REASONING_H_

#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace kvserve::frontend {

struct ReasoningTags {
  std::string start, end;
};

// The tags of a --reasoning-parser name (qwen3, deepseek_r1); InvalidArgument for another.
absl::StatusOr<ReasoningTags> ReasoningTagsFor(std::string_view parser);

// Whether a prompt's text ends inside an opened reasoning block (the template wrote the start
// tag), so the output starts in it.
bool PromptOpensReasoning(std::string_view prompt_tail, const ReasoningTags& tags);

class ReasoningSplitter {
 public:
  struct Parts {
    std::string reasoning, content;
  };

  // `inside`: the output starts within the block (PromptOpensReasoning).
  ReasoningSplitter(ReasoningTags tags, bool inside);

  Parts Append(std::string_view text);
  Parts Finish();

 private:
  enum class State { kStart, kReasoning, kContent };
  // Moves what is certain from pending_ into `out`; `final`: no more text comes.
  void Drain(Parts& out, bool final);

  ReasoningTags tags_;
  State state_;
  std::string pending_;  // text not yet placed
};

}  // namespace kvserve::frontend

#endif  // KVSERVE_FRONTEND_OUTPUT_REASONING_H_
