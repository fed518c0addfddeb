#include "frontend/request/messages_request.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/string_util.h"
#include "frontend/request/openai_request.h"
#include "frontend/request/request_json.h"

namespace kvserve::frontend {
namespace {

using json = nlohmann::json;

// Anthropic's client tools as chat's functions (a server or versioned tool has a type).
constexpr ToolShape kTools = {
    .type = "custom",
    .type_optional = true,
    .served = "client tools (name, input_schema); server and versioned tools are not",
    .fields = {{"name", "name"}, {"description", "description"}, {"input_schema", "parameters"}}};

// Anthropic's parameters kvserve does not serve, refused by name unless unset.
absl::Status RefuseUnserved(const json& o) {
  for (const char* key : {"mcp_servers", "container", "context_management"}) {
    if (Field(o, key)) return BadParam(key, "is not served; leave it unset");
  }
  if (const json* t = Field(o, "service_tier"); t && *t != "auto" && *t != "standard_only") {
    return BadParam("service_tier", "kvserve has one tier: \"auto\" or \"standard_only\"");
  }
  return absl::OkStatus();
}

// A text block's text.
absl::StatusOr<std::string> BlockText(const json& b, const std::string& block) {
  const json* t = Field(b, "text");
  if (t == nullptr || !t->is_string()) return BadParam(block + ".text", "must be a string");
  return t->get<std::string>();
}

// A string, or a list of text blocks joined.
absl::StatusOr<std::string> TextOf(const json& content, const std::string& param) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) return BadParam(param, "must be a string or a list of blocks");
  std::string text;
  for (size_t j = 0; j < content.size(); ++j) {
    const std::string block = absl::StrCat(param, "[", j, "]");
    const json* type = Field(content[j], "type");
    if (type == nullptr || *type != "text") {
      return BadParam(block + ".type", "only text blocks are served here");
    }
    ASSIGN_OR_RETURN(std::string t, BlockText(content[j], block));
    text += t;
  }
  return text;
}

// One message's content blocks as chat messages: an assistant turn's thinking, text and
// tool_use blocks become one assistant message; a user turn's tool_result blocks become tool
// messages, its text a user message after them.
class MessageBuilder {
 public:
  absl::Status Add(const json& m, size_t i) {
    const std::string param = absl::StrCat("messages[", i, "]");
    if (!m.is_object()) return BadParam(param, "must be an object");
    const json* role = Field(m, "role");
    if (role == nullptr || (*role != "user" && *role != "assistant")) {
      return BadParam(param + ".role", "must be \"user\" or \"assistant\"");
    }
    const json* content = Field(m, "content");
    if (content == nullptr) return BadParam(param + ".content", "is required");
    if (content->is_string()) {
      Push({{"role", *role}, {"content", *content}}, param);
      return absl::OkStatus();
    }
    if (!content->is_array()) {
      return BadParam(param + ".content", "must be a string or a list of blocks");
    }
    return *role == "assistant" ? AddAssistant(*content, param) : AddUser(*content, param);
  }

  void AddSystem(std::string text) {
    Push({{"role", "system"}, {"content", std::move(text)}}, "system");
  }

  json messages = json::array();
  std::vector<std::string> origin;

 private:
  void Push(json message, std::string from) {
    messages.push_back(std::move(message));
    origin.push_back(std::move(from));
  }

  absl::Status AddAssistant(const json& blocks, const std::string& param) {
    json turn = {{"role", "assistant"}, {"content", ""}};
    std::string text, thinking;
    for (size_t j = 0; j < blocks.size(); ++j) {
      const std::string block = absl::StrCat(param, ".content[", j, "]");
      const json& b = blocks[j];
      const json* type = Field(b, "type");
      if (type != nullptr && *type == "text") {
        ASSIGN_OR_RETURN(std::string t, BlockText(b, block));
        text += t;
      } else if (type != nullptr && *type == "thinking") {
        const json* t = Field(b, "thinking");
        if (t == nullptr || !t->is_string()) {
          return BadParam(block + ".thinking", "must be a string");
        }
        thinking += t->get<std::string>();
      } else if (type != nullptr && *type == "tool_use") {
        ASSIGN_OR_RETURN(std::string id, RequiredString(b, "id", block));
        ASSIGN_OR_RETURN(std::string name, RequiredString(b, "name", block));
        const json* input = Field(b, "input");
        if (input == nullptr || !input->is_object()) {
          return BadParam(block + ".input", "must be an object");
        }
        if (!turn.contains("tool_calls")) turn["tool_calls"] = json::array();
        turn["tool_calls"].push_back(
            {{"id", std::move(id)},
             {"type", "function"},
             {"function", {{"name", std::move(name)}, {"arguments", input->dump()}}}});
      } else {
        return BadParam(block + ".type",
                        "an assistant turn takes text, thinking and tool_use blocks");
      }
    }
    turn["content"] = std::move(text);
    if (!thinking.empty()) turn["reasoning_content"] = std::move(thinking);
    Push(std::move(turn), param);
    return absl::OkStatus();
  }

  absl::Status AddUser(const json& blocks, const std::string& param) {
    std::string text;
    for (size_t j = 0; j < blocks.size(); ++j) {
      const std::string block = absl::StrCat(param, ".content[", j, "]");
      const json& b = blocks[j];
      const json* type = Field(b, "type");
      if (type != nullptr && *type == "text") {
        ASSIGN_OR_RETURN(std::string t, BlockText(b, block));
        text += t;
      } else if (type != nullptr && *type == "tool_result") {
        ASSIGN_OR_RETURN(std::string id, RequiredString(b, "tool_use_id", block));
        std::string result;
        if (const json* c = Field(b, "content")) {
          ASSIGN_OR_RETURN(result, TextOf(*c, block + ".content"));
        }
        Push({{"role", "tool"}, {"tool_call_id", std::move(id)}, {"content", std::move(result)}},
             block);
      } else {
        return BadParam(block + ".type",
                        "a user turn takes text and tool_result blocks (kvserve's models take "
                        "text: image and document blocks are not served)");
      }
    }
    if (!text.empty() || messages.empty() || messages.back()["role"] != "tool") {
      Push({{"role", "user"}, {"content", std::move(text)}}, param);
    }
    return absl::OkStatus();
  }
};

// A final assistant turn is a prefill: the answer continues its text (the Messages API's rule;
// chat's continue_final_message). Empty, it asks for nothing; as Anthropic's API, its text may
// not end in whitespace, and it cannot hold tool calls.
absl::Status ContinueFinalTurn(json& messages, const std::string& param, json& chat) {
  json& turn = messages.back();
  if (turn.contains("tool_calls")) {
    return BadParam(param + ".content", "a final assistant turn is continued: it takes text alone");
  }
  const std::string text = turn.value("content", "");
  if (text.empty()) {
    messages.erase(messages.size() - 1);
    return absl::OkStatus();
  }
  if (absl::ascii_isspace(static_cast<unsigned char>(text.back()))) {
    return BadParam(param + ".content", "a final assistant turn may not end in whitespace");
  }
  chat["continue_final_message"] = true;
  chat["add_generation_prompt"] = false;
  return absl::OkStatus();
}

absl::Status TranslateMessages(const json& o, const RequestLimits& limits, json& chat,
                               MessagesRequest& r) {
  MessageBuilder in;
  if (const json* system = Field(o, "system")) {
    ASSIGN_OR_RETURN(std::string text, TextOf(*system, "system"));
    in.AddSystem(std::move(text));
  }
  const json* messages = Field(o, "messages");
  if (messages == nullptr || !messages->is_array() || messages->empty()) {
    return BadParam("messages", "must be a non-empty list");
  }
  RETURN_IF_ERROR(CheckMessageCount(*messages, "messages", "messages", limits.max_messages));
  for (size_t i = 0; i < messages->size(); ++i) RETURN_IF_ERROR(in.Add((*messages)[i], i));
  const json* last_role = Field(messages->back(), "role");
  if (last_role != nullptr && *last_role == "assistant") {
    RETURN_IF_ERROR(
        ContinueFinalTurn(in.messages, absl::StrCat("messages[", messages->size() - 1, "]"), chat));
  }
  chat["messages"] = std::move(in.messages);
  r.message_origin = std::move(in.origin);
  return absl::OkStatus();
}

absl::Status TranslateToolUse(const json& o, json& chat) {
  RETURN_IF_ERROR(TranslateTools(o, kTools, chat));
  const json* choice = Field(o, "tool_choice");
  if (choice == nullptr) return absl::OkStatus();
  const json* type = Field(*choice, "type");
  if (type == nullptr) return BadParam("tool_choice.type", "is required");
  if (*type == "auto") {
    chat["tool_choice"] = "auto";
  } else if (*type == "any") {
    chat["tool_choice"] = "required";
  } else if (*type == "none") {
    chat["tool_choice"] = "none";
  } else if (*type == "tool") {
    const json* name = Field(*choice, "name");
    if (name == nullptr) return BadParam("tool_choice.name", "is required");
    chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", *name}}}};
  } else {
    return BadParam("tool_choice.type", "must be \"auto\", \"any\", \"tool\" or \"none\"");
  }
  if (const json* single = Field(*choice, "disable_parallel_tool_use")) {
    if (!single->is_boolean()) {
      return BadParam("tool_choice.disable_parallel_tool_use", "must be true or false");
    }
    chat["parallel_tool_calls"] = !single->get<bool>();
  }
  return absl::OkStatus();
}

// Anthropic's ranges, narrower than chat's: temperature and top_p in [0, 1].
absl::Status CheckRanges(const json& o) {
  for (const char* key : {"temperature", "top_p"}) {
    const json* v = Field(o, key);
    if (v != nullptr && v->is_number() && !(v->get<double>() >= 0 && v->get<double>() <= 1)) {
      return BadParam(
          key, absl::StrCat("must be in [0, 1] (the Messages API's range), got ", v->dump()));
    }
  }
  return absl::OkStatus();
}

// Structured outputs: output_config.format, or the beta's top-level output_format, {"type":
// "json_schema", "schema"} as chat's response_format (the constraint engine holds the text to
// the schema). output_config's other keys are not served. Sets r.format_param to the one given.
absl::Status TranslateOutputFormat(const json& o, json& chat, MessagesRequest& r) {
  const json* format = nullptr;
  if (const json* config = Field(o, "output_config")) {
    if (!config->is_object()) return BadParam("output_config", "must be an object");
    for (const auto& [key, value] : config->items()) {
      if (key != "format" && !value.is_null()) {
        return BadParam("output_config." + key, "is not served; leave it unset");
      }
    }
    format = Field(*config, "format");
    r.format_param = "output_config.format";
  }
  if (const json* beta = Field(o, "output_format")) {
    if (format != nullptr) {
      return BadParam("output_format", "give output_config.format or output_format, not both");
    }
    format = beta;
    r.format_param = "output_format";
  }
  if (format == nullptr) return absl::OkStatus();
  const json* type = Field(*format, "type");
  if (type == nullptr || *type != "json_schema") {
    return BadParam(r.format_param + ".type", "must be \"json_schema\"");
  }
  const json* schema = Field(*format, "schema");
  if (schema == nullptr || !schema->is_object()) {
    return BadParam(r.format_param + ".schema", "must be a JSON schema (an object)");
  }
  chat["response_format"] = {{"type", "json_schema"},
                             {"json_schema", {{"name", "output"}, {"schema", *schema}}}};
  return absl::OkStatus();
}

absl::Status TranslateRest(const json& o, bool counting, json& chat) {
  if (const json* stops = Field(o, "stop_sequences")) {
    if (!stops->is_array()) return BadParam("stop_sequences", "must be a list of strings");
    chat["stop"] = *stops;
  }
  if (const json* meta = Field(o, "metadata")) {
    if (!meta->is_object()) return BadParam("metadata", "must be an object");
    if (const json* user = Field(*meta, "user_id")) chat["user"] = *user;
  }
  if (const json* thinking = Field(o, "thinking")) {
    const json* type = Field(*thinking, "type");
    if (type != nullptr && *type == "disabled") {
      chat["chat_template_kwargs"] = {{"enable_thinking", false}};
    } else if (type != nullptr && *type == "enabled") {
      return BadParam("thinking.budget_tokens",
                      "a thinking budget is not enforced by kvserve; leave thinking unset (the "
                      "model thinks as its chat template has it) or send {\"type\": "
                      "\"disabled\"}");
    } else {
      return BadParam("thinking.type", "must be \"enabled\" or \"disabled\"");
    }
  }
  if (counting) {
    chat["max_tokens"] = 1;
  } else if (!chat.contains("max_tokens")) {
    return BadParam("max_tokens", "is required");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<MessagesRequest> TranslateMessagesRequest(std::string_view body,
                                                         const RequestLimits& limits,
                                                         bool counting) {
  ASSIGN_OR_RETURN(const json o, ParseBodyObject(body));
  RETURN_IF_ERROR(RefuseUnserved(o));
  MessagesRequest r;
  json chat = json::object();
  PassThrough(o, {"max_tokens"}, chat);
  RETURN_IF_ERROR(TranslateMessages(o, limits, chat, r));
  RETURN_IF_ERROR(TranslateToolUse(o, chat));
  RETURN_IF_ERROR(CheckRanges(o));
  RETURN_IF_ERROR(TranslateOutputFormat(o, chat, r));
  RETURN_IF_ERROR(TranslateRest(o, counting, chat));
  r.chat_body = chat.dump();
  return r;
}

std::string RenameMessagesParam(std::string_view message, const MessagesRequest& r) {
  const std::string schema = r.format_param + ".schema";
  return RenameChatParam(message, r.message_origin, "messages",
                         {{"stop", "stop_sequences"},
                          {"parallel_tool_calls", "tool_choice.disable_parallel_tool_use"},
                          {"user", "metadata.user_id"},
                          {"response_format.json_schema.schema", schema},
                          {"response_format", r.format_param}},
                         "input_schema");
}

absl::StatusOr<ParsedRequest> ParseMessagesAsChat(const MessagesRequest& r,
                                                  const RequestLimits& limits) {
  absl::StatusOr<ParsedRequest> parsed = ParseCompletionRequest(r.chat_body, /*chat=*/true, limits);
  if (!parsed.ok()) {
    return absl::Status(parsed.status().code(),
                        RenameMessagesParam(StdSv(parsed.status().message()), r));
  }
  return parsed;
}

}  // namespace kvserve::frontend
