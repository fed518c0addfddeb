#include "common/tokenizer/chat_template.h"

#include <algorithm>
#include <ctime>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/json_text.h"
#include "common/status_macros.h"
#include "common/string_util.h"
#include "utf8proc.h"

namespace kvserve::tokenizer {
namespace {

// Python's str.isspace() (what Jinja's `trim` and `.strip()` use in transformers).
bool IsPySpace(int32_t cp) {
  if ((cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85) return true;
  if (cp < 0x80) return false;
  utf8proc_category_t c = utf8proc_category(cp);
  if (c == UTF8PROC_CATEGORY_ZS || c == UTF8PROC_CATEGORY_ZL || c == UTF8PROC_CATEGORY_ZP) {
    return true;
  }
  return utf8proc_get_property(cp)->bidi_class == UTF8PROC_BIDI_CLASS_WS ||
         utf8proc_get_property(cp)->bidi_class == UTF8PROC_BIDI_CLASS_B ||
         utf8proc_get_property(cp)->bidi_class == UTF8PROC_BIDI_CLASS_S;
}

// Strips leading and/or trailing characters for which `strip` is true.
template <typename Pred>
std::string_view StripIf(std::string_view s, bool left, bool right, Pred strip) {
  const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(s.data());
  size_t begin = 0, end = s.size();
  if (left) {
    while (begin < end) {
      utf8proc_int32_t cp;
      utf8proc_ssize_t n = utf8proc_iterate(p + begin, end - begin, &cp);
      if (n <= 0 || !strip(cp)) break;
      begin += n;
    }
  }
  if (right) {
    while (end > begin) {
      size_t start = end - 1;
      while (start > begin && (static_cast<unsigned char>(s[start]) & 0xc0) == 0x80) --start;
      utf8proc_int32_t cp;
      if (utf8proc_iterate(p + start, end - start, &cp) <= 0 || !strip(cp)) break;
      end = start;
    }
  }
  return s.substr(begin, end - begin);
}

std::string_view Trim(std::string_view s) { return StripIf(s, true, true, IsPySpace); }
bool IsNewline(int32_t cp) { return cp == '\n'; }
std::string_view StripNewlines(std::string_view s, bool left, bool right) {
  return StripIf(s, left, right, IsNewline);
}

bool StartsWith(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool EndsWith(std::string_view s, std::string_view p) {
  return s.size() >= p.size() && s.substr(s.size() - p.size()) == p;
}

constexpr std::string_view kQwenToolsIntro =
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
constexpr std::string_view kQwenToolsOutro =
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
    "<function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n";

constexpr std::string_view kLlamaToolsIntro =
    "Given the following functions, please respond with a JSON for a function call with its "
    "proper arguments that best answers the given prompt.\n\nRespond in the format "
    "{\"name\": function name, \"parameters\": dictionary of argument name and its value}."
    "Do not use variables.\n\n";

// Qwen3's system turn: the system message, and the tools when there are any.
absl::StatusOr<std::string> ChatMlSystem(absl::Span<const ChatMessage> messages,
                                         const ChatRenderOptions& options) {
  const bool system = messages[0].role == "system";
  if (options.tools.empty()) {
    return system ? absl::StrCat("<|im_start|>system\n", messages[0].content, "<|im_end|>\n")
                  : std::string();
  }
  std::string out = "<|im_start|>system\n";
  if (system) absl::StrAppend(&out, messages[0].content, "\n\n");
  out += kQwenToolsIntro;
  for (size_t i = 0; i < options.tools.size(); ++i) {
    absl::StatusOr<std::string> tool = PythonJsonText(options.tools[i]);
    if (!tool.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("tools[", i, "]: ", tool.status().message()));
    }
    absl::StrAppend(&out, "\n", *tool);
  }
  out += kQwenToolsOutro;
  return out;
}

// An assistant turn's tool calls in Qwen3's <tool_call> blocks; `content`: the turn's text.
absl::Status AppendToolCalls(const ChatMessage& m, size_t index, std::string_view content,
                             std::string& out) {
  for (size_t j = 0; j < m.tool_calls.size(); ++j) {
    const ToolCall& call = m.tool_calls[j];
    absl::StatusOr<std::string> arguments = PythonJsonText(call.arguments);
    if (!arguments.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("messages[", index, "].tool_calls[", j,
                       "].function.arguments: ", arguments.status().message()));
    }
    if (j > 0 || !content.empty()) out += '\n';
    absl::StrAppend(&out, "<tool_call>\n{\"name\": \"", call.name,
                    "\", \"arguments\": ", *arguments, "}\n</tool_call>");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ChatTemplate> ChatTemplate::Detect(std::string_view template_text,
                                                  std::string_view bos_token) {
  if (template_text.find("Cutting Knowledge Date") != std::string_view::npos) {
    ChatTemplate t(Family::kLlama31, bos_token);
    t.dated_today_ = template_text.find("strftime_now") != std::string_view::npos;
    return t;
  }
  if (template_text.find("<|start_header_id|>") != std::string_view::npos) {
    ChatTemplate t(Family::kLlama3, bos_token);
    t.always_generation_prompt_ =
        template_text.find("add_generation_prompt") == std::string_view::npos;
    return t;
  }
  if (template_text.find("<|im_start|>") != std::string_view::npos) {
    return ChatTemplate(Family::kChatMl, bos_token);
  }
  if (template_text.empty()) {
    return absl::InvalidArgumentError("the tokenizer has no chat_template");
  }
  return absl::InvalidArgumentError(
      "the tokenizer's chat_template is neither the llama3 nor the chatml family");
}

ChatTemplate ChatTemplate::ForFamily(Family family, std::string_view bos_token) {
  return ChatTemplate(family, bos_token);
}

absl::StatusOr<std::string> ChatTemplate::Render(absl::Span<const ChatMessage> messages,
                                                 const ChatRenderOptions& options) const {
  if (messages.empty()) return absl::InvalidArgumentError("messages must not be empty");
  for (size_t i = 0; i < messages.size(); ++i) RETURN_IF_ERROR(CheckRole(messages[i].role, i));
  if (family_ == Family::kLlama3) return RenderLlama3(messages, options);
  if (family_ == Family::kLlama31) return RenderLlama31(messages, options);
  return RenderChatMl(messages, options);
}

// Llama 3's and 3.1's templates write any other role into its header as it is (3.1 reads
// `ipython` as `tool`); Qwen3's renders only the four and drops any other message without a
// trace, so there one is refused rather than lost.
absl::Status ChatTemplate::CheckRole(const std::string& role, size_t index) const {
  if (role == "system" || role == "user" || role == "assistant" || role == "tool") {
    return absl::OkStatus();
  }
  const std::string param = absl::StrCat("messages[", index, "].role");
  if (family_ == Family::kChatMl) {
    return absl::InvalidArgumentError(absl::StrCat(
        param, ": '", role.substr(0, 64),
        "' is not one of system, user, assistant, tool, the roles this model's chat template "
        "(ChatML, Qwen3's) renders; it drops a message with any other"));
  }
  // A custom role goes into the header as text: a name, never markup or a line break.
  const bool plain =
      !role.empty() && role.size() <= 64 && std::all_of(role.begin(), role.end(), [](char c) {
        return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' ||
               c == '.';
      });
  if (!plain) {
    return absl::InvalidArgumentError(absl::StrCat(
        param, ": a custom role is a name of 1 to 64 letters, digits, '_', '-' or '.'"));
  }
  return absl::OkStatus();
}

std::string ChatTemplate::RenderLlama3(absl::Span<const ChatMessage> messages,
                                       const ChatRenderOptions& options) const {
  std::string out = bos_token_;
  for (const ChatMessage& m : messages) {
    absl::StrAppend(&out, "<|start_header_id|>", m.role, "<|end_header_id|>\n\n",
                    Sv(Trim(m.content)), "<|eot_id|>");
  }
  if (options.add_generation_prompt || always_generation_prompt_) {
    out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  }
  return out;
}

// Mirrors Llama 3.1's template (tools in the first user turn, its default).
absl::StatusOr<std::string> ChatTemplate::RenderLlama31(absl::Span<const ChatMessage> messages,
                                                        const ChatRenderOptions& options) const {
  std::string_view system;
  if (messages[0].role == "system") {
    system = Trim(messages[0].content);
    messages.remove_prefix(1);
  }
  const bool tools = !options.tools.empty();
  std::string out =
      absl::StrCat(bos_token_, "<|start_header_id|>system<|end_header_id|>\n\n",
                   tools ? "Environment: ipython\n" : "",
                   "Cutting Knowledge Date: December 2023\nToday Date: ", DateString(options),
                   "\n\n", Sv(system), "<|eot_id|>");
  if (tools) {
    if (messages.empty()) {
      return absl::InvalidArgumentError("messages: tools need a first user message to go in");
    }
    absl::StrAppend(&out, "<|start_header_id|>user<|end_header_id|>\n\n", Sv(kLlamaToolsIntro));
    for (size_t i = 0; i < options.tools.size(); ++i) {
      absl::StatusOr<std::string> tool = PythonJsonText(options.tools[i], /*indent=*/4);
      if (!tool.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("tools[", i, "]: ", tool.status().message()));
      }
      absl::StrAppend(&out, *tool, "\n\n");
    }
    absl::StrAppend(&out, Sv(Trim(messages[0].content)), "<|eot_id|>");
    messages.remove_prefix(1);
  }
  for (const ChatMessage& m : messages) {
    if (!m.tool_calls.empty()) {
      if (m.tool_calls.size() != 1) {
        return absl::InvalidArgumentError(
            "messages: this model's template takes one tool call per assistant turn");
      }
      ASSIGN_OR_RETURN(std::string arguments, PythonJsonText(m.tool_calls[0].arguments));
      absl::StrAppend(&out, "<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"",
                      m.tool_calls[0].name, "\", \"parameters\": ", arguments, "}<|eot_id|>");
    } else if (m.role == "tool" || m.role == "ipython") {
      // A string is `iterable` to Jinja: written as JSON.
      absl::StrAppend(&out, "<|start_header_id|>ipython<|end_header_id|>\n\n",
                      PythonJsonString(m.content), "<|eot_id|>");
    } else {
      absl::StrAppend(&out, "<|start_header_id|>", m.role, "<|end_header_id|>\n\n",
                      Sv(Trim(m.content)), "<|eot_id|>");
    }
  }
  if (options.add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

std::string ChatTemplate::DateString(const ChatRenderOptions& options) const {
  if (!options.date_string.empty()) return options.date_string;
  if (!dated_today_) return "26 Jul 2024";
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[32];
  return std::string(buf, std::strftime(buf, sizeof(buf), "%d %b %Y", &tm));
}

// Mirrors Qwen3's template: a leading system message (with the tools), user turns, assistant
// turns whose reasoning is kept only after the last real user query (and their tool calls),
// and tool responses folded into user turns.
absl::StatusOr<std::string> ChatTemplate::RenderChatMl(absl::Span<const ChatMessage> messages,
                                                       const ChatRenderOptions& options) const {
  ASSIGN_OR_RETURN(std::string out, ChatMlSystem(messages, options));
  // The last user message that is not a wrapped tool response.
  size_t last_query = messages.size() - 1;
  for (size_t k = messages.size(); k-- > 0;) {
    const ChatMessage& m = messages[k];
    if (m.role == "user" &&
        !(StartsWith(m.content, "<tool_response>") && EndsWith(m.content, "</tool_response>"))) {
      last_query = k;
      break;
    }
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    const bool last = i + 1 == messages.size();
    if (m.role == "user" || (m.role == "system" && i != 0)) {
      absl::StrAppend(&out, "<|im_start|>", m.role, "\n", m.content, "<|im_end|>\n");
    } else if (m.role == "assistant") {
      std::string_view content = m.content;
      std::string_view reasoning;
      if (m.reasoning_content) {
        reasoning = *m.reasoning_content;
      } else if (size_t close = content.rfind("</think>"); close != std::string_view::npos) {
        std::string_view before = content.substr(0, content.find("</think>"));
        before = StripNewlines(before, false, true);
        size_t open = before.rfind("<think>");
        reasoning = StripNewlines(open == std::string_view::npos ? before : before.substr(open + 7),
                                  true, false);
        content = StripNewlines(content.substr(close + 8), true, false);
      }
      if (i > last_query && (last || !reasoning.empty())) {
        absl::StrAppend(&out, "<|im_start|>assistant\n<think>\n",
                        Sv(StripNewlines(reasoning, true, true)), "\n</think>\n\n",
                        Sv(StripNewlines(content, true, false)));
      } else {
        absl::StrAppend(&out, "<|im_start|>assistant\n", Sv(content));
      }
      RETURN_IF_ERROR(AppendToolCalls(m, i, content, out));
      out += "<|im_end|>\n";
    } else if (m.role == "tool") {
      if (i == 0 || messages[i - 1].role != "tool") out += "<|im_start|>user";
      absl::StrAppend(&out, "\n<tool_response>\n", m.content, "\n</tool_response>");
      if (last || messages[i + 1].role != "tool") out += "<|im_end|>\n";
    }
  }
  if (options.add_generation_prompt) {
    out += "<|im_start|>assistant\n";
    if (options.enable_thinking.has_value() && !*options.enable_thinking) {
      out += "<think>\n\n</think>\n\n";
    }
  }
  return out;
}

}  // namespace kvserve::tokenizer
