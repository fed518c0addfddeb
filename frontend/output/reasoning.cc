#include "frontend/output/reasoning.h"

#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/string_util.h"
#include "frontend/output/hold_back.h"

namespace kvserve::frontend {

absl::StatusOr<ReasoningTags> ReasoningTagsFor(std::string_view parser) {
  if (parser == "qwen3" || parser == "deepseek_r1") return ReasoningTags{"<think>", "</think>"};
  return absl::InvalidArgumentError(absl::StrCat("--reasoning-parser: unknown parser '", Sv(parser),
                                                 "' (qwen3 and deepseek_r1 are served)"));
}

bool PromptOpensReasoning(std::string_view prompt_tail, const ReasoningTags& tags) {
  return absl::EndsWith(absl::StripTrailingAsciiWhitespace(Sv(prompt_tail)), tags.start);
}

ReasoningSplitter::ReasoningSplitter(ReasoningTags tags, bool inside)
    : tags_(std::move(tags)), state_(inside ? State::kReasoning : State::kStart) {}

ReasoningSplitter::Parts ReasoningSplitter::Append(std::string_view text) {
  pending_ += text;
  Parts out;
  Drain(out, false);
  return out;
}

ReasoningSplitter::Parts ReasoningSplitter::Finish() {
  Parts out;
  Drain(out, true);
  return out;
}

void ReasoningSplitter::Drain(Parts& out, bool final) {
  if (state_ == State::kStart) {
    if (absl::StartsWith(pending_, tags_.start)) {
      pending_.erase(0, tags_.start.size());
      state_ = State::kReasoning;
    } else if (!final && absl::StartsWith(tags_.start, pending_)) {
      return;  // could still become the start tag
    } else {
      state_ = State::kContent;
    }
  }
  if (state_ == State::kReasoning) {
    const size_t end = pending_.find(tags_.end);
    if (end == std::string::npos) {
      const size_t keep = final ? 0 : PartialMatchLength(pending_, tags_.end);
      out.reasoning += pending_.substr(0, pending_.size() - keep);
      pending_.erase(0, pending_.size() - keep);
      return;
    }
    out.reasoning += pending_.substr(0, end);
    pending_.erase(0, end + tags_.end.size());
    state_ = State::kContent;
  }
  out.content += pending_;
  pending_.clear();
}

}  // namespace kvserve::frontend
