// The output pipeline (frontend/output/output_pipeline.h): its stages composed as a chat request
// with a reasoning parser and tools uses them, the same result in any pieces, and a stop string
// ending the stream for the stages after it.
#include "frontend/output/output_pipeline.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace kvserve::frontend {
namespace {

OutputPipeline Chat(std::vector<std::string> stops, bool include_stop_str = false) {
  OutputPipeline p;
  p.Add(StopStringStage(std::move(stops), include_stop_str));
  p.Add(ReasoningStage(*ReasoningTagsFor("qwen3"), /*inside=*/false));
  p.Add(ToolCallStage(ToolOutput::kHermes, "", {"f"}));
  return p;
}

// The whole of a stream pushed `piece` bytes at a time (whole UTF-8 characters: ASCII here).
OutputDelta PushAll(OutputPipeline p, const std::string& text, size_t piece) {
  OutputDelta out;
  for (size_t i = 0; i < text.size() && !out.stopped; i += piece) {
    p.Push(text.substr(i, piece), {}, out);
  }
  if (!out.stopped) p.Push("", {.final = true}, out);
  return out;
}

TEST(OutputPipelineTest, StagesSplitReasoningToolCallsAndContent) {
  const std::string text =
      "<think>weigh it</think>Sure. <tool_call>{\"name\": \"f\", \"arguments\": {\"x\": 1}}"
      "</tool_call>";
  for (size_t piece : {size_t{1}, size_t{3}, size_t{7}, text.size()}) {
    const OutputDelta out = PushAll(Chat({}), text, piece);
    EXPECT_EQ(out.reasoning, "weigh it") << piece;
    EXPECT_EQ(out.text, "Sure. ") << piece;
    ASSERT_EQ(out.calls.size(), 1u) << piece;
    EXPECT_EQ(out.calls[0].name, "f");
    EXPECT_EQ(out.calls[0].arguments, "{\"x\": 1}");
    EXPECT_FALSE(out.stopped);
  }
}

// A stop string ends the stream: the text before it passes, the stages after the stop see the
// end (the reasoning splitter gives up the block it held), nothing after it is taken.
TEST(OutputPipelineTest, AStopStringEndsTheStreamForEveryLaterStage) {
  const std::string text = "<think>hm</think>answer ### more";
  for (size_t piece : {size_t{1}, size_t{4}, text.size()}) {
    const OutputDelta out = PushAll(Chat({"###"}), text, piece);
    EXPECT_TRUE(out.stopped) << piece;
    EXPECT_EQ(out.reasoning, "hm") << piece;
    EXPECT_EQ(out.text, "answer ") << piece;
  }
  const OutputDelta with = PushAll(Chat({"###"}, /*include_stop_str=*/true), text, 2);
  EXPECT_EQ(with.text, "answer ###");
  // An unfinished reasoning block at a stop is reasoning, not content.
  const OutputDelta cut = PushAll(Chat({"!"}), "<think>still thinking!", 5);
  EXPECT_EQ(cut.reasoning, "still thinking");
  EXPECT_EQ(cut.text, "");
}

// Before min_tokens stop strings do not apply; text that might start one is held back until the
// stream says what it is, and the end gives it up.
TEST(OutputPipelineTest, StopsAreCheckedOnlyWhereAskedAndHeldBackTextIsFlushed) {
  OutputPipeline p;
  p.Add(StopStringStage({"END"}, false));
  OutputDelta out;
  p.Push("xEND", {.check_stops = false}, out);
  EXPECT_EQ(out.text, "xEND");
  EXPECT_FALSE(out.stopped);
  p.Push("yE", {}, out);
  EXPECT_EQ(out.text, "xENDy");  // "E" may start END
  p.Push("N", {.final = true}, out);
  EXPECT_EQ(out.text, "xENDyEN");
  EXPECT_FALSE(out.stopped);
}

}  // namespace
}  // namespace kvserve::frontend
