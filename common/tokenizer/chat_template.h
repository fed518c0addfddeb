// Chat prompt rendering for the two template families kvserve serves, chosen from the
// `chat_template` string of tokenizer_config.json:
//   - llama3: `<|start_header_id|>role<|end_header_id|>\n\n` + content.strip() + `<|eot_id|>`,
//     BOS first (Meta Llama 3 Instruct's template);
//   - chatml: `<|im_start|>role\n` + content + `<|im_end|>\n` (Qwen2/2.5/3), including Qwen3's
//     handling of `<think>` reasoning in assistant turns and `enable_thinking`.
// Rendering is native C++ (no Jinja engine); tests compare it with a Jinja renderer on the
// real templates.
//
//   ASSIGN_OR_RETURN(ChatTemplate tmpl, ChatTemplate::Detect(tok->chat_template(),
//   tok->bos_token())); ASSIGN_OR_RETURN(std::string prompt, tmpl.Render(messages,
//   {.add_generation_prompt = true}));
//
// Immutable; safe from many threads.
#ifndef KVSERVE_COMMON_TOKENIZER_CHAT_TEMPLATE_H_
#define KVSERVE_COMMON_TOKENIZER_CHAT_TEMPLATE_H_

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace kvserve::tokenizer {

struct ChatMessage {
  std::string role;  // system, user, assistant, tool
  std::string content;
  // Assistant reasoning given separately (chatml/Qwen3); otherwise taken from <think> tags.
  std::optional<std::string> reasoning_content;
};

struct ChatRenderOptions {
  bool add_generation_prompt = true;
  // chatml/Qwen3: false adds an empty think block so the model answers directly.
  std::optional<bool> enable_thinking;
};

class ChatTemplate {
 public:
  enum class Family { kLlama3, kChatMl };

  // Picks the family from the template text. InvalidArgument if the template is empty or
  // belongs to neither family.
  static absl::StatusOr<ChatTemplate> Detect(std::string_view template_text,
                                             std::string_view bos_token);
  static ChatTemplate ForFamily(Family family, std::string_view bos_token);

  // InvalidArgument for an empty message list or an unknown role (naming it).
  absl::StatusOr<std::string> Render(absl::Span<const ChatMessage> messages,
                                     const ChatRenderOptions& options) const;

  [[nodiscard]] Family family() const { return family_; }

 private:
  ChatTemplate(Family family, std::string_view bos) : family_(family), bos_token_(bos) {}
  std::string RenderLlama3(absl::Span<const ChatMessage> messages,
                           const ChatRenderOptions& options) const;
  std::string RenderChatMl(absl::Span<const ChatMessage> messages,
                           const ChatRenderOptions& options) const;

  Family family_;
  std::string bos_token_;
  // Some published llama3 templates end with the assistant header unconditionally.
  bool always_generation_prompt_ = false;
};

}  // namespace kvserve::tokenizer

#endif  // KVSERVE_COMMON_TOKENIZER_CHAT_TEMPLATE_H_
