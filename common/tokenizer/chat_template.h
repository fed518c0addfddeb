// Chat prompt rendering for the two template families kvserve serves, chosen from the
// `chat_template` string of tokenizer_config.json:
//   - llama3: `<|start_header_id|>role<|end_header_id|>\n\n` + content.strip() + `<|eot_id|>`,
//     BOS first (Meta Llama 3 Instruct's template);
//   - chatml: `<|im_start|>role\n` + content + `<|im_end|>\n` (Qwen2/2.5/3), including Qwen3's
//     handling of `<think>` reasoning in assistant turns and `enable_thinking`, and its tools:
//     a `# Tools` system block listing them, `<tool_call>` blocks in assistant turns, tool
//     results as `<tool_response>` in user turns.
//   - llama31: Llama 3.1+'s (3.1, 3.2, 3.3): a system turn with the knowledge cut-off and the
//     date, tools as JSON (indented) in the first user turn, a call as {"name", "parameters"}
//     in an assistant turn, tool results in `ipython` turns.
// Llama 3.0's template takes no tools: they are left out of its prompts, as Jinja leaves them.
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

// A call an assistant turn made (OpenAI's tool_calls entry).
struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // a JSON text (an object)
};

struct ChatMessage {
  std::string role;  // system, user, assistant, tool
  std::string content;
  // Assistant reasoning given separately (chatml/Qwen3); otherwise taken from <think> tags.
  std::optional<std::string> reasoning_content;
  std::vector<ToolCall> tool_calls;  // assistant
  std::string tool_call_id;          // tool: the call it answers
};

struct ChatRenderOptions {
  bool add_generation_prompt = true;
  // chatml/Qwen3: false adds an empty think block so the model answers directly.
  std::optional<bool> enable_thinking;
  // The tools the model may call, each a JSON text ({"type": "function", "function": {...}}),
  // written into the prompt as the template's `tojson` writes them.
  std::vector<std::string> tools;
  // llama31: the date the system turn gives ("26 Jul 2024" in the template; today's date,
  // "%d %b %Y", for templates that ask for strftime_now); set, it overrides both.
  std::string date_string;
};

class ChatTemplate {
 public:
  enum class Family { kLlama3, kLlama31, kChatMl };

  // Picks the family from the template text. InvalidArgument if the template is empty or
  // belongs to neither family.
  static absl::StatusOr<ChatTemplate> Detect(std::string_view template_text,
                                             std::string_view bos_token);
  static ChatTemplate ForFamily(Family family, std::string_view bos_token);

  // InvalidArgument for an empty message list, a role the template does not render (naming
  // it: ChatML takes system, user, assistant, tool; Llama 3's render any other role, a plain
  // name, in its header as their templates do), or a tool or tool call's arguments that are not
  // JSON.
  absl::StatusOr<std::string> Render(absl::Span<const ChatMessage> messages,
                                     const ChatRenderOptions& options) const;

  [[nodiscard]] Family family() const { return family_; }

 private:
  ChatTemplate(Family family, std::string_view bos) : family_(family), bos_token_(bos) {}
  [[nodiscard]] absl::Status CheckRole(const std::string& role, size_t index) const;
  std::string RenderLlama3(absl::Span<const ChatMessage> messages,
                           const ChatRenderOptions& options) const;
  absl::StatusOr<std::string> RenderLlama31(absl::Span<const ChatMessage> messages,
                                            const ChatRenderOptions& options) const;
  [[nodiscard]] std::string DateString(const ChatRenderOptions& options) const;
  absl::StatusOr<std::string> RenderChatMl(absl::Span<const ChatMessage> messages,
                                           const ChatRenderOptions& options) const;

  Family family_;
  std::string bos_token_;
  // Some published llama3 templates end with the assistant header unconditionally.
  bool always_generation_prompt_ = false;
  // llama31 templates that date their prompts with strftime_now (Llama 3.2).
  bool dated_today_ = false;
};

}  // namespace kvserve::tokenizer

#endif  // KVSERVE_COMMON_TOKENIZER_CHAT_TEMPLATE_H_
