#include "frontend/request/prompt.h"

#include <algorithm>
#include <cctype>
#include <optional>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/types/span.h"
#include "common/status_macros.h"
#include "common/string_util.h"
#include "common/tokenizer/chat_template.h"
#include "common/utf8.h"

namespace kvserve::frontend {
namespace pb = kvserve::v1;
namespace {

// InvalidArgument naming every id of `ids` outside the vocabulary (the first 16 of them) and
// the vocabulary's size.
absl::Status CheckVocabulary(const tokenizer::Tokenizer& tok, std::string_view param,
                             absl::Span<const int32_t> ids) {
  constexpr int kNamed = 16;
  std::vector<int32_t> bad;
  for (int32_t id : ids) {
    if (!tok.IsValidId(id)) bad.push_back(id);
  }
  if (bad.empty()) return absl::OkStatus();
  const size_t named = std::min<size_t>(bad.size(), kNamed);
  std::string list = absl::StrJoin(bad.begin(), bad.begin() + named, ", ");
  if (bad.size() > named) absl::StrAppend(&list, " and ", bad.size() - named, " more");
  return absl::InvalidArgumentError(absl::StrCat(
      Sv(param), ": token id", bad.size() > 1 ? "s " : " ", list, bad.size() > 1 ? " are" : " is",
      " not in the vocabulary (", tok.vocab_size(), " ids, 0 to ", tok.vocab_size() - 1, ")"));
}

// The rendered chat cut just after the final message's text, so that the model continues that
// message (continue_final_message; transformers' rule: the text's last occurrence, else that of
// the text without its surrounding whitespace).
absl::StatusOr<std::string> OpenFinalMessage(std::string text, std::string_view final_text) {
  std::string_view find = final_text;
  size_t at = text.rfind(find);
  if (at == std::string::npos) {
    find = StdSv(absl::StripAsciiWhitespace(Sv(final_text)));
    at = find.empty() ? std::string::npos : text.rfind(find);
  }
  if (at == std::string::npos) {
    return absl::InvalidArgumentError(
        "continue_final_message: the final message's text does not appear in the chat as the "
        "model's template renders it");
  }
  text.resize(at + find.size());
  return text;
}

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
  if (r.continue_final_message) {
    ASSIGN_OR_RETURN(*text, OpenFinalMessage(*std::move(text), r.messages.back().content));
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
    RETURN_IF_ERROR(CheckVocabulary(tok, param, ids));
  }
  if (r.truncate_prompt_tokens && static_cast<int>(ids.size()) > *r.truncate_prompt_tokens) {
    if (r.truncate_right) {
      ids.resize(*r.truncate_prompt_tokens);
    } else {
      ids.erase(ids.begin(), ids.end() - *r.truncate_prompt_tokens);
    }
  }
  if (ids.empty()) return absl::InvalidArgumentError(absl::StrCat(param, ": must not be empty"));
  return ids;
}

absl::Status ResolveTokenParameters(const tokenizer::Tokenizer& tok, ParsedRequest* r) {
  pb::SamplingParams& s = r->sampling;
  std::vector<int32_t> biased;  // the map's order is arbitrary: named in id order
  for (const auto& [id, bias] : s.logit_bias()) biased.push_back(id);
  std::sort(biased.begin(), biased.end());
  RETURN_IF_ERROR(CheckVocabulary(tok, "logit_bias", biased));
  RETURN_IF_ERROR(CheckVocabulary(tok, "allowed_token_ids", s.allowed_token_ids()));
  RETURN_IF_ERROR(CheckVocabulary(tok, "logprob_token_ids", s.logprob_token_ids()));
  RETURN_IF_ERROR(CheckVocabulary(tok, "stop_token_ids", r->stop_token_ids));
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

}  // namespace kvserve::frontend
