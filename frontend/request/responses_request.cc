#include "frontend/request/responses_request.h"

#include <optional>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "common/string_util.h"
#include "frontend/request/openai_request.h"
#include "frontend/request/request_json.h"

namespace kvserve::frontend {
namespace {

using json = nlohmann::json;

// The Responses API's function tools as chat's (hosted tools have other types).
constexpr ToolShape kTools = {.type = "function",
                              .served = "function tools (type \"function\")",
                              .fields = {{"name", "name"},
                                         {"description", "description"},
                                         {"parameters", "parameters"},
                                         {"strict", "strict"}}};

// What kvserve answers for the state it does not keep.
constexpr char kNoConversations[] =
    "is not served: chain responses with previous_response_id, or send the whole conversation "
    "in input";
constexpr char kNoStore[] =
    "needs a Responses store, and this server runs without one (--responses-store none): send "
    "the whole conversation in input";

// The Responses parameters kvserve does not serve, refused by name unless unset or neutral.
absl::Status RefuseUnserved(const json& o) {
  if (Field(o, "conversation")) return BadParam("conversation", kNoConversations);
  if (const json* b = Field(o, "background"); b && *b != false) {
    return BadParam("background",
                    "background responses are not served (kvserve answers while the client "
                    "waits or streams); leave it unset or false");
  }
  if (Field(o, "prompt")) return BadParam("prompt", "reusable prompt templates are not served");
  if (const json* t = Field(o, "truncation"); t && *t != "disabled") {
    return BadParam("truncation",
                    "only \"disabled\" is served: an input past the context is a 400");
  }
  if (Field(o, "max_tool_calls"))
    return BadParam("max_tool_calls", "is not served; leave it unset");
  if (const json* r = Field(o, "reasoning")) {
    if (!r->is_object()) return BadParam("reasoning", "must be an object");
    for (const char* key : {"effort", "summary", "generate_summary"}) {
      if (Field(*r, key)) {
        return BadParam(absl::StrCat("reasoning.", key),
                        "is not served: the model reasons as its chat template has it "
                        "(chat_template_kwargs.enable_thinking where the template reads it)");
      }
    }
  }
  if (const json* t = Field(o, "service_tier"); t && *t != "auto" && *t != "default") {
    return BadParam("service_tier", "kvserve has one tier: \"auto\" or \"default\"");
  }
  if (const json* s = Field(o, "stream_options")) {
    if (!s->is_object()) return BadParam("stream_options", "must be an object");
    for (const auto& [key, value] : s->items()) {
      if (key != "include_obfuscation" || (!value.is_null() && value != false)) {
        return BadParam(absl::StrCat("stream_options.", key.substr(0, 64)),
                        "is not served (kvserve pads no stream events); leave it unset or false");
      }
    }
  }
  return absl::OkStatus();
}

// A content list's text: its text parts joined; other part types are refused by name.
absl::StatusOr<std::string> ContentText(const json& content, const std::string& param) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) return BadParam(param, "must be a string or a list of content parts");
  std::string text;
  for (size_t j = 0; j < content.size(); ++j) {
    const json& p = content[j];
    const std::string part = absl::StrCat(param, "[", j, "]");
    const json* type = p.is_object() ? Field(p, "type") : nullptr;
    if (type == nullptr || !type->is_string())
      return BadParam(part, "must be an object with a type");
    const std::string t = type->get<std::string>();
    if (t != "input_text" && t != "output_text" && t != "text" && t != "refusal") {
      return BadParam(part + ".type", absl::StrCat("'", t.substr(0, 64),
                                                   "' is not served: kvserve's models take text "
                                                   "(input_text, output_text)"));
    }
    const char* field = t == "refusal" ? "refusal" : "text";
    const json* value = Field(p, field);
    if (value == nullptr || !value->is_string()) {
      return BadParam(absl::StrCat(part, ".", field), "must be a string");
    }
    text += value->get<std::string>();
  }
  return text;
}

// Input items as chat messages. A function call joins the assistant turn before it (the model's
// message or calls of the same output); reasoning goes to the assistant turn after it.
class InputBuilder {
 public:
  void AddText(std::string role, std::string text, std::string origin) {
    Push({{"role", std::move(role)}, {"content", std::move(text)}}, std::move(origin));
  }

  // `param`: how errors name the item ("input[3]").
  absl::Status AddItem(const json& item, const std::string& param) {
    if (!item.is_object()) return BadParam(param, "must be an object");
    const json* type = Field(item, "type");
    if (type != nullptr && !type->is_string()) return BadParam(param + ".type", "must be a string");
    const std::string t = type ? type->get<std::string>() : "message";
    if (t == "message") return AddMessage(item, param);
    if (t == "function_call") return AddCall(item, param);
    if (t == "function_call_output") return AddCallOutput(item, param);
    if (t == "reasoning") return AddReasoning(item, param);
    if (t == "item_reference")
      return BadParam(param, absl::StrCat("item references ", kNoConversations));
    return BadParam(param + ".type",
                    absl::StrCat("'", t.substr(0, 64),
                                 "' is not served: kvserve takes message, "
                                 "function_call, function_call_output and reasoning "
                                 "items"));
  }

  // Reasoning with no assistant turn after it (an output that only reasoned) is one.
  json Finish() {
    if (reasoning_) Push({{"role", "assistant"}, {"content", ""}}, reasoning_origin_);
    return std::move(messages_);
  }
  std::vector<std::string> origin;

 private:
  absl::Status AddMessage(const json& item, const std::string& param) {
    const json* role = Field(item, "role");
    if (role == nullptr || !role->is_string()) return BadParam(param + ".role", "is required");
    std::string r = role->get<std::string>();
    if (r == "developer") r = "system";  // OpenAI's name for system instructions
    if (r != "user" && r != "system" && r != "assistant") {
      return BadParam(param + ".role", absl::StrCat("'", r.substr(0, 64),
                                                    "' is not one of user, system, developer, "
                                                    "assistant"));
    }
    const json* content = Field(item, "content");
    if (content == nullptr) return BadParam(param + ".content", "is required");
    ASSIGN_OR_RETURN(std::string text, ContentText(*content, param + ".content"));
    Push({{"role", std::move(r)}, {"content", std::move(text)}}, param);
    return absl::OkStatus();
  }

  absl::Status AddCall(const json& item, const std::string& param) {
    ASSIGN_OR_RETURN(std::string call_id, RequiredString(item, "call_id", param));
    ASSIGN_OR_RETURN(std::string name, RequiredString(item, "name", param));
    const json* args = Field(item, "arguments");
    if (args == nullptr || !args->is_string()) {
      return BadParam(param + ".arguments", "must be a JSON text (a string)");
    }
    json call = {{"id", std::move(call_id)},
                 {"type", "function"},
                 {"function", {{"name", std::move(name)}, {"arguments", *args}}}};
    if (!assistant_open_ || reasoning_) Push({{"role", "assistant"}, {"content", ""}}, param);
    json& turn = messages_.back();
    if (!turn.contains("tool_calls")) turn["tool_calls"] = json::array();
    turn["tool_calls"].push_back(std::move(call));
    assistant_open_ = true;
    return absl::OkStatus();
  }

  absl::Status AddCallOutput(const json& item, const std::string& param) {
    ASSIGN_OR_RETURN(std::string call_id, RequiredString(item, "call_id", param));
    const json* output = Field(item, "output");
    if (output == nullptr) return BadParam(param + ".output", "is required");
    ASSIGN_OR_RETURN(std::string text, ContentText(*output, param + ".output"));
    Push({{"role", "tool"}, {"tool_call_id", std::move(call_id)}, {"content", std::move(text)}},
         param);
    return absl::OkStatus();
  }

  absl::Status AddReasoning(const json& item, const std::string& param) {
    if (Field(item, "encrypted_content")) {
      return BadParam(param + ".encrypted_content", "is not served: kvserve encrypts no reasoning");
    }
    std::string text;
    for (const char* key : {"content", "summary"}) {
      const json* parts = Field(item, key);
      if (parts == nullptr) continue;
      if (!parts->is_array()) return BadParam(absl::StrCat(param, ".", key), "must be a list");
      for (size_t j = 0; j < parts->size(); ++j) {
        const json& p = (*parts)[j];
        const json* t = p.is_object() ? Field(p, "text") : nullptr;
        if (t == nullptr || !t->is_string()) {
          return BadParam(absl::StrCat(param, ".", key, "[", j, "].text"), "must be a string");
        }
        text += t->get<std::string>();
      }
      if (!text.empty()) break;  // the reasoning itself when given, else its summary
    }
    if (!reasoning_) reasoning_origin_ = param;
    reasoning_ = reasoning_.value_or("") + text;
    assistant_open_ = false;
    return absl::OkStatus();
  }

  void Push(json message, std::string from) {
    const bool assistant = message["role"] == "assistant";
    if (assistant && reasoning_) {
      message["reasoning_content"] = *std::move(reasoning_);
      reasoning_.reset();
    } else if (reasoning_) {  // reasoning that no assistant turn followed
      messages_.push_back(
          {{"role", "assistant"}, {"content", ""}, {"reasoning_content", *reasoning_}});
      origin.push_back(reasoning_origin_);
      reasoning_.reset();
    }
    messages_.push_back(std::move(message));
    origin.push_back(std::move(from));
    assistant_open_ = assistant;
  }

  json messages_ = json::array();
  std::optional<std::string> reasoning_;
  std::string reasoning_origin_;
  bool assistant_open_ = false;  // the last message is an assistant turn calls may join
};

// Gives each input item without an id one ("msg_", "fc_", "fco_" or "rs_" and 24 hex digits),
// so that input_items can list and page them.
void NameItems(json& items) {
  thread_local absl::BitGen gen;
  for (json& item : items) {
    if (const json* id = Field(item, "id"); id && id->is_string()) continue;
    const json* type = Field(item, "type");
    const std::string t = type ? type->get<std::string>() : "message";
    const char* prefix = t == "function_call"          ? "fc_"
                         : t == "function_call_output" ? "fco_"
                         : t == "reasoning"            ? "rs_"
                                                       : "msg_";
    item["id"] = absl::StrFormat("%s%08x%016x", prefix, absl::Uniform<uint32_t>(gen),
                                 absl::Uniform<uint64_t>(gen));
  }
}

absl::Status TranslateInput(const json& o, const RequestLimits& limits, json& chat,
                            ResponsesRequest& r) {
  InputBuilder in;
  if (const json* ins = Field(o, "instructions")) {
    if (!ins->is_string()) return BadParam("instructions", "must be a string");
    in.AddText("system", ins->get<std::string>(), "instructions");
  }
  for (size_t i = 0; i < r.previous_items.size(); ++i) {
    RETURN_IF_ERROR(
        in.AddItem(r.previous_items[i], absl::StrCat("previous_response_id's items[", i, "]")));
  }
  const json* input = Field(o, "input");
  if (input == nullptr) return BadParam("input", "is required");
  if (input->is_string()) {
    in.AddText("user", input->get<std::string>(), "input");
    r.input_items.push_back({{"type", "message"},
                             {"role", "user"},
                             {"content", {{{"type", "input_text"}, {"text", *input}}}}});
  } else if (input->is_array() && !input->empty()) {
    RETURN_IF_ERROR(CheckMessageCount(*input, "input", "items", limits.max_messages));
    for (size_t i = 0; i < input->size(); ++i) {
      RETURN_IF_ERROR(in.AddItem((*input)[i], absl::StrCat("input[", i, "]")));
      r.input_items.push_back((*input)[i]);
    }
  } else {
    return BadParam("input", "must be a string or a non-empty list of items");
  }
  if (r.previous_items.size() + r.input_items.size() > static_cast<size_t>(limits.max_messages)) {
    return BadParam("previous_response_id",
                    absl::StrCat("the conversation with this input has ",
                                 r.previous_items.size() + r.input_items.size(),
                                 " items, more than the ", limits.max_messages, " served"));
  }
  NameItems(r.input_items);
  chat["messages"] = in.Finish();
  r.message_origin = std::move(in.origin);
  return absl::OkStatus();
}

// store and previous_response_id: the response kept, the conversation before it loaded.
absl::Status TranslateState(const json& o, const ResponsesState& state, ResponsesRequest& r) {
  r.store = state.store;
  if (const json* s = Field(o, "store"); s && !s->is_null()) {
    if (!s->is_boolean()) return BadParam("store", "must be true or false");
    r.store = s->get<bool>();
    if (r.store && !state.store) return BadParam("store", kNoStore);
  }
  const json* previous = Field(o, "previous_response_id");
  if (previous == nullptr || previous->is_null()) return absl::OkStatus();
  if (!previous->is_string() || previous->get_ref<const std::string&>().empty()) {
    return BadParam("previous_response_id", "must be a response's id");
  }
  if (!state.store) return BadParam("previous_response_id", kNoStore);
  r.previous_response_id = previous->get<std::string>();
  absl::StatusOr<json> items = state.conversation(r.previous_response_id);
  if (absl::IsNotFound(items.status())) {
    return absl::NotFoundError(absl::StrCat("previous_response_id: no stored response '",
                                            r.previous_response_id.substr(0, 128), "'"));
  }
  RETURN_IF_ERROR(items.status());
  if (!items->is_array()) return absl::InternalError("a stored conversation is not a list");
  r.previous_items = *std::move(items);
  return absl::OkStatus();
}

absl::Status TranslateToolUse(const json& o, json& chat) {
  RETURN_IF_ERROR(TranslateTools(o, kTools, chat));
  if (const json* choice = Field(o, "tool_choice")) {
    if (choice->is_string()) {
      chat["tool_choice"] = *choice;
    } else if (choice->is_object() && Field(*choice, "type") && (*choice)["type"] == "function") {
      const json* name = Field(*choice, "name");
      if (name == nullptr) return BadParam("tool_choice.name", "is required");
      chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", *name}}}};
    } else {
      return BadParam("tool_choice",
                      "must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", "
                      "\"name\": ...}; hosted tools and allowed_tools are not served");
    }
  }
  return absl::OkStatus();
}

absl::Status TranslateText(const json& o, json& chat) {
  const json* text = Field(o, "text");
  if (text == nullptr) return absl::OkStatus();
  if (!text->is_object()) return BadParam("text", "must be an object");
  if (Field(*text, "verbosity")) return BadParam("text.verbosity", "is not served; leave it unset");
  const json* format = Field(*text, "format");
  if (format == nullptr) return absl::OkStatus();
  const json* type = format->is_object() ? Field(*format, "type") : nullptr;
  if (type == nullptr) return BadParam("text.format.type", "is required");
  if (*type == "text") return absl::OkStatus();
  if (*type == "json_object") {
    chat["response_format"] = {{"type", "json_object"}};
    return absl::OkStatus();
  }
  if (*type != "json_schema") {
    return BadParam("text.format.type", "must be \"text\", \"json_object\" or \"json_schema\"");
  }
  json schema = json::object();
  for (const char* key : {"name", "schema", "strict", "description"}) {
    if (format->contains(key)) schema[key] = (*format)[key];
  }
  chat["response_format"] = {{"type", "json_schema"}, {"json_schema", std::move(schema)}};
  return absl::OkStatus();
}

absl::Status TranslateLogprobs(const json& o, json& chat, ResponsesRequest& r) {
  if (const json* include = Field(o, "include")) {
    if (!include->is_array()) return BadParam("include", "must be a list");
    for (size_t j = 0; j < include->size(); ++j) {
      if ((*include)[j] != "message.output_text.logprobs") {
        return BadParam(absl::StrCat("include[", j, "]"),
                        "only \"message.output_text.logprobs\" is served");
      }
      r.output_logprobs = true;
    }
  }
  const json* top = Field(o, "top_logprobs");
  if (top != nullptr && *top != 0) r.output_logprobs = true;
  if (r.output_logprobs) {
    chat["logprobs"] = true;
    chat["top_logprobs"] = top ? *top : json(0);
  }
  return absl::OkStatus();
}

// The request's fields as the response object repeats them, OpenAI's defaults filled in.
json EchoFields(const json& o, const ResponsesRequest& r) {
  auto value = [&](const char* key, json fallback) {
    const json* v = Field(o, key);
    return v ? *v : fallback;
  };
  json text = {{"format", {{"type", "text"}}}};
  if (const json* t = Field(o, "text"); t && Field(*t, "format")) text["format"] = (*t)["format"];
  return {{"instructions", value("instructions", nullptr)},
          {"max_output_tokens", value("max_output_tokens", nullptr)},
          {"metadata", value("metadata", json::object())},
          {"parallel_tool_calls", value("parallel_tool_calls", true)},
          {"previous_response_id",
           r.previous_response_id.empty() ? json(nullptr) : json(r.previous_response_id)},
          {"reasoning", {{"effort", nullptr}, {"summary", nullptr}}},
          {"store", r.store},
          {"background", false},
          {"service_tier", "default"},
          {"temperature", value("temperature", 1.0)},
          {"text", std::move(text)},
          {"tool_choice", value("tool_choice", "auto")},
          {"tools", value("tools", json::array())},
          {"top_logprobs", value("top_logprobs", 0)},
          {"top_p", value("top_p", 1.0)},
          {"truncation", "disabled"},
          {"user", value("user", nullptr)}};
}

std::string RenameParam(std::string_view message, const ResponsesRequest& r) {
  return RenameChatParam(message, r.message_origin, "input",
                         {{"max_tokens", "max_output_tokens"},
                          {"response_format.json_schema", "text.format"},
                          {"response_format", "text.format"}});
}

}  // namespace

absl::StatusOr<ResponsesRequest> TranslateResponsesRequest(std::string_view body,
                                                           const RequestLimits& limits,
                                                           const ResponsesState& state) {
  ASSIGN_OR_RETURN(const json o, ParseBodyObject(body));
  RETURN_IF_ERROR(RefuseUnserved(o));
  ResponsesRequest r;
  RETURN_IF_ERROR(TranslateState(o, state, r));
  json chat = json::object();
  PassThrough(o, {"parallel_tool_calls", "user", "skip_special_tokens", "chat_template_kwargs"},
              chat);
  if (const json* max = Field(o, "max_output_tokens")) chat["max_tokens"] = *max;
  RETURN_IF_ERROR(TranslateInput(o, limits, chat, r));
  RETURN_IF_ERROR(TranslateToolUse(o, chat));
  RETURN_IF_ERROR(TranslateText(o, chat));
  RETURN_IF_ERROR(TranslateLogprobs(o, chat, r));
  if (const json* key = Field(o, "prompt_cache_key")) {
    if (!key->is_string()) return BadParam("prompt_cache_key", "must be a string");
    r.prompt_cache_key = key->get<std::string>();
  }
  if (const json* m = Field(o, "metadata")) {
    if (!m->is_object() || m->size() > 16) {
      return BadParam("metadata", "must be an object of at most 16 string values");
    }
    for (const auto& [key, value] : m->items()) {
      if (!value.is_string() || key.size() > 64 ||
          value.get_ref<const std::string&>().size() > 512) {
        return BadParam("metadata",
                        "keys are at most 64 characters, values strings of at most 512");
      }
    }
  }
  r.echo = EchoFields(o, r);
  r.chat_body = chat.dump();
  return r;
}

absl::StatusOr<ParsedRequest> ParseResponsesAsChat(const ResponsesRequest& r,
                                                   const RequestLimits& limits) {
  absl::StatusOr<ParsedRequest> parsed = ParseCompletionRequest(r.chat_body, /*chat=*/true, limits);
  if (!parsed.ok()) {
    return absl::Status(parsed.status().code(), RenameParam(StdSv(parsed.status().message()), r));
  }
  return parsed;
}

std::string RenameResponsesParam(std::string_view message, const ResponsesRequest& r) {
  return RenameParam(message, r);
}

}  // namespace kvserve::frontend
