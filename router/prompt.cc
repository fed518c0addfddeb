#include "router/prompt.h"

#include <algorithm>
#include <cctype>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/tokenizer/chat_template.h"
#include "common/utf8.h"

namespace kvserve::router {
namespace pb = kvserve::v1;
namespace {

// NFC everywhere, and no trailing whitespace on system messages, so that near-identical
// prompts share prefix blocks.
void NormalizeMessages(ParsedRequest& r) {
  for (tokenizer::ChatMessage& m : r.messages) {
    m.content = Utf8Nfc(m.content);
    if (m.role == "system") {
      while (!m.content.empty() && std::isspace(static_cast<unsigned char>(m.content.back()))) {
        m.content.pop_back();
      }
    }
  }
}

absl::StatusOr<std::vector<int>> ChatIds(const tokenizer::Tokenizer& tok, const ParsedRequest& r) {
  ASSIGN_OR_RETURN(tokenizer::ChatTemplate tmpl,
                   tokenizer::ChatTemplate::Detect(tok.chat_template(), tok.bos_token()));
  tokenizer::ChatRenderOptions opts;
  opts.add_generation_prompt = r.add_generation_prompt;
  opts.enable_thinking = r.enable_thinking;
  for (const ToolSpec& tool : r.tool_use.tools) opts.tools.push_back(tool.definition);
  absl::StatusOr<std::string> text = tmpl.Render(r.messages, opts);
  if (!text.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("messages: ", text.status().message()));
  }
  return tok.Encode(*text, false);
}

}  // namespace

absl::StatusOr<std::vector<int>> PromptIds(const tokenizer::Tokenizer& tok,
                                           const ParsedRequest& request, bool normalize,
                                           size_t index) {
  const ParsedRequest& r = request;
  const std::string param =
      r.prompts.size() > 1 ? absl::StrCat("prompt[", index, "]") : std::string("prompt");
  std::vector<int> ids;
  if (r.chat && normalize) {
    ParsedRequest normalized = r;
    NormalizeMessages(normalized);
    ASSIGN_OR_RETURN(ids, ChatIds(tok, normalized));
  } else if (r.chat) {
    ASSIGN_OR_RETURN(ids, ChatIds(tok, r));
  } else if (index >= r.prompts.size()) {
    return absl::InvalidArgumentError(absl::StrCat(param, ": is required"));
  } else if (const PromptInput& p = r.prompts[index]; p.text) {
    ASSIGN_OR_RETURN(ids, tok.Encode(normalize ? Utf8Nfc(*p.text) : *p.text, r.add_special_tokens));
  } else {
    ids.assign(p.ids.begin(), p.ids.end());
    for (int id : ids) {
      if (!tok.IsValidId(id)) {
        return absl::InvalidArgumentError(
            absl::StrCat(param, ": token id ", id, " is not in the vocabulary"));
      }
    }
  }
  if (r.truncate_prompt_tokens && static_cast<int>(ids.size()) > *r.truncate_prompt_tokens) {
    ids.erase(ids.begin(), ids.end() - *r.truncate_prompt_tokens);
  }
  if (ids.empty()) return absl::InvalidArgumentError(absl::StrCat(param, ": must not be empty"));
  return ids;
}

absl::Status ResolveTokenParameters(const tokenizer::Tokenizer& tok, ParsedRequest* r) {
  auto check = [&](int32_t id, const char* param) {
    return tok.IsValidId(id) ? absl::OkStatus()
                             : absl::InvalidArgumentError(absl::StrCat(
                                   param, ": token id ", id, " is not in the vocabulary"));
  };
  pb::SamplingParams& s = r->sampling;
  std::vector<int32_t> biased;  // the map's order is arbitrary: check in id order
  for (const auto& [id, bias] : s.logit_bias()) biased.push_back(id);
  std::sort(biased.begin(), biased.end());
  for (int32_t id : biased) RETURN_IF_ERROR(check(id, "logit_bias"));
  for (int32_t id : s.allowed_token_ids()) RETURN_IF_ERROR(check(id, "allowed_token_ids"));
  s.clear_bad_words();
  const auto add_word = [&](const std::vector<int>& ids) {
    s.add_bad_words()->mutable_ids()->Add(ids.begin(), ids.end());
  };
  for (const std::string& word : r->bad_words) {
    std::string_view bare = word;
    while (!bare.empty() && bare.front() == ' ') bare.remove_prefix(1);
    if (bare.empty()) return absl::InvalidArgumentError("bad_words: a word is empty");
    ASSIGN_OR_RETURN(std::vector<int> alone, tok.Encode(bare, false));
    ASSIGN_OR_RETURN(std::vector<int> spaced, tok.Encode(" " + std::string(bare), false));
    if (!spaced.empty() && !alone.empty() && spaced.front() != alone.front() &&
        spaced.size() == alone.size()) {
      add_word(spaced);
    }
    if (!alone.empty()) add_word(alone);
  }
  return absl::OkStatus();
}

}  // namespace kvserve::router
