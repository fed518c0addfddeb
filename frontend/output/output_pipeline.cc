#include "frontend/output/output_pipeline.h"

#include <iterator>
#include <utility>

#include "frontend/output/stop_strings.h"

namespace kvserve::frontend {

void OutputPipeline::Push(std::string text, StreamPosition at, OutputDelta& out) {
  for (const std::unique_ptr<OutputStage>& stage : stages_) {
    text = stage->Process(std::move(text), at, out);
    if (out.stopped) at.final = true;
  }
  out.text += text;
}

namespace {

class StopStrings final : public OutputStage {
 public:
  StopStrings(std::vector<std::string> stops, bool include_stop_str)
      : matcher_(std::move(stops)), include_stop_str_(include_stop_str) {}

  std::string Process(std::string text, const StreamPosition& at, OutputDelta& out) override {
    if (matcher_.stopped()) return {};
    StopStringMatcher::Result r = matcher_.Append(text, at.check_stops);
    if (r.stopped) {
      out.stopped = true;
      out.stop_string = r.matched;
      if (include_stop_str_) r.emit += r.matched;
      return std::move(r.emit);
    }
    if (at.final) r.emit += matcher_.Flush();
    return std::move(r.emit);
  }

 private:
  StopStringMatcher matcher_;
  bool include_stop_str_;
};

class Reasoning final : public OutputStage {
 public:
  Reasoning(const ReasoningTags& tags, bool inside) : splitter_(tags, inside) {}

  std::string Process(std::string text, const StreamPosition& at, OutputDelta& out) override {
    ReasoningSplitter::Parts parts = splitter_.Append(text);
    if (at.final) {
      ReasoningSplitter::Parts rest = splitter_.Finish();
      parts.reasoning += rest.reasoning;
      parts.content += rest.content;
    }
    out.reasoning += parts.reasoning;
    return std::move(parts.content);
  }

 private:
  ReasoningSplitter splitter_;
};

class ToolCalls final : public OutputStage {
 public:
  ToolCalls(ToolOutput format, std::string name, std::vector<std::string> names)
      : splitter_(format, std::move(name), std::move(names)) {}

  std::string Process(std::string text, const StreamPosition& at, OutputDelta& out) override {
    ToolCallSplitter::Parts parts = splitter_.Append(text);
    if (at.final) {
      ToolCallSplitter::Parts rest = splitter_.Finish();
      parts.content += rest.content;
      std::move(rest.calls.begin(), rest.calls.end(), std::back_inserter(parts.calls));
    }
    std::move(parts.calls.begin(), parts.calls.end(), std::back_inserter(out.calls));
    return std::move(parts.content);
  }

 private:
  ToolCallSplitter splitter_;
};

}  // namespace

std::unique_ptr<OutputStage> StopStringStage(std::vector<std::string> stops,
                                             bool include_stop_str) {
  return std::make_unique<StopStrings>(std::move(stops), include_stop_str);
}

std::unique_ptr<OutputStage> ReasoningStage(const ReasoningTags& tags, bool inside) {
  return std::make_unique<Reasoning>(tags, inside);
}

std::unique_ptr<OutputStage> ToolCallStage(ToolOutput format, std::string name,
                                           std::vector<std::string> names) {
  return std::make_unique<ToolCalls>(format, std::move(name), std::move(names));
}

}  // namespace kvserve::frontend
