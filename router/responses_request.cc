#include "router/responses_request.h"

#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/string_util.h"

namespace kvserve::router {
namespace {

using json = nlohmann::json;

constexpr int kMaxDepth = 128;  // nesting of the body's arrays and objects

// vLLM's sampling extras that a Responses body may carry, passed to the chat request as they are.
constexpr const char* kPassThrough[] = {"model",
                                        "temperature",
                                        "top_p",
                                        "stream",
                                        "parallel_tool_calls",
                                        "user",
                                        "top_k",
                                        "min_p",
                                        "seed",
                                        "repetition_penalty",
                                        "presence_penalty",
                                        "frequency_penalty",
                                        "request_id",
                                        "priority",
                                        "cache_salt",
                                        "skip_special_tokens",
                                        "chat_template_kwargs"};

absl::Status Bad(std::string_view param, std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(Sv(param), ": ", Sv(what)));
}

// The field, or null when it is absent or JSON null.
const json* Get(const json& o, const char* key) {
  auto it = o.find(key);
  return it == o.end() || it->is_null() ? nullptr : &*it;
}

// What a stateless server answers for a stateful ask.
constexpr std::string_view kStateless =
    "kvserve keeps no responses or conversations (stateless): send the whole conversation in "
    "input";

// InvalidArgument when the body nests arrays and objects deeper than kMaxDepth (the JSON library
// recurses when writing).
absl::Status CheckDepth(std::string_view body) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (char c : body) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > kMaxDepth) {
        return Bad("body", absl::StrCat("nests arrays and objects deeper than ", kMaxDepth));
      }
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return absl::OkStatus();
}

// The Responses parameters kvserve does not serve, refused by name unless unset or neutral.
absl::Status RefuseUnserved(const json& o) {
  if (Get(o, "previous_response_id")) return Bad("previous_response_id", kStateless);
  if (Get(o, "conversation")) return Bad("conversation", kStateless);
  if (const json* s = Get(o, "store"); s && *s != false) {
    return Bad("store", "kvserve keeps no responses (stateless); leave it unset or false");
  }
  if (const json* b = Get(o, "background"); b && *b != false) {
    return Bad("background",
               "background responses need stored responses, which kvserve does "
               "not keep; leave it unset or false");
  }
  if (Get(o, "prompt")) return Bad("prompt", "reusable prompt templates are not served");
  if (const json* t = Get(o, "truncation"); t && *t != "disabled") {
    return Bad("truncation", "only \"disabled\" is served: an input past the context is a 400");
  }
  if (Get(o, "max_tool_calls")) return Bad("max_tool_calls", "is not served; leave it unset");
  if (const json* r = Get(o, "reasoning")) {
    if (!r->is_object()) return Bad("reasoning", "must be an object");
    for (const char* key : {"effort", "summary", "generate_summary"}) {
      if (Get(*r, key)) {
        return Bad(absl::StrCat("reasoning.", key),
                   "is not served: the model reasons as its chat template has it "
                   "(chat_template_kwargs.enable_thinking where the template reads it)");
      }
    }
  }
  if (const json* t = Get(o, "service_tier"); t && *t != "auto" && *t != "default") {
    return Bad("service_tier", "kvserve has one tier: \"auto\" or \"default\"");
  }
  if (const json* s = Get(o, "stream_options")) {
    if (!s->is_object()) return Bad("stream_options", "must be an object");
    for (const auto& [key, value] : s->items()) {
      if (key != "include_obfuscation" || (!value.is_null() && value != false)) {
        return Bad(absl::StrCat("stream_options.", key.substr(0, 64)),
                   "is not served (kvserve pads no stream events); leave it unset or false");
      }
    }
  }
  return absl::OkStatus();
}

// A content list's text: its text parts joined; other part types are refused by name.
absl::StatusOr<std::string> ContentText(const json& content, const std::string& param) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) return Bad(param, "must be a string or a list of content parts");
  std::string text;
  for (size_t j = 0; j < content.size(); ++j) {
    const json& p = content[j];
    const std::string part = absl::StrCat(param, "[", j, "]");
    const json* type = p.is_object() ? Get(p, "type") : nullptr;
    if (type == nullptr || !type->is_string()) return Bad(part, "must be an object with a type");
    const std::string t = type->get<std::string>();
    if (t != "input_text" && t != "output_text" && t != "text" && t != "refusal") {
      return Bad(part + ".type", absl::StrCat("'", t.substr(0, 64),
                                              "' is not served: kvserve's models take text "
                                              "(input_text, output_text)"));
    }
    const char* field = t == "refusal" ? "refusal" : "text";
    const json* value = Get(p, field);
    if (value == nullptr || !value->is_string()) {
      return Bad(absl::StrCat(part, ".", field), "must be a string");
    }
    text += value->get<std::string>();
  }
  return text;
}

absl::StatusOr<std::string> StringField(const json& o, const char* key, const std::string& param) {
  const json* v = Get(o, key);
  if (v == nullptr || !v->is_string() || v->get_ref<const std::string&>().empty()) {
    return Bad(absl::StrCat(param, ".", key), "must be a non-empty string");
  }
  return v->get<std::string>();
}

// Input items as chat messages. A function call joins the assistant turn before it (the model's
// message or calls of the same output); reasoning goes to the assistant turn after it.
class InputBuilder {
 public:
  void AddText(std::string role, std::string text, std::string origin) {
    Push({{"role", std::move(role)}, {"content", std::move(text)}}, std::move(origin));
  }

  absl::Status AddItem(const json& item, size_t i) {
    const std::string param = absl::StrCat("input[", i, "]");
    if (!item.is_object()) return Bad(param, "must be an object");
    const json* type = Get(item, "type");
    if (type != nullptr && !type->is_string()) return Bad(param + ".type", "must be a string");
    const std::string t = type ? type->get<std::string>() : "message";
    if (t == "message") return AddMessage(item, param);
    if (t == "function_call") return AddCall(item, param);
    if (t == "function_call_output") return AddCallOutput(item, param);
    if (t == "reasoning") return AddReasoning(item, param);
    if (t == "item_reference") return Bad(param, kStateless);
    return Bad(param + ".type", absl::StrCat("'", t.substr(0, 64),
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
    const json* role = Get(item, "role");
    if (role == nullptr || !role->is_string()) return Bad(param + ".role", "is required");
    std::string r = role->get<std::string>();
    if (r == "developer") r = "system";  // OpenAI's name for system instructions
    if (r != "user" && r != "system" && r != "assistant") {
      return Bad(param + ".role", absl::StrCat("'", r.substr(0, 64),
                                               "' is not one of user, system, developer, "
                                               "assistant"));
    }
    const json* content = Get(item, "content");
    if (content == nullptr) return Bad(param + ".content", "is required");
    ASSIGN_OR_RETURN(std::string text, ContentText(*content, param + ".content"));
    Push({{"role", std::move(r)}, {"content", std::move(text)}}, param);
    return absl::OkStatus();
  }

  absl::Status AddCall(const json& item, const std::string& param) {
    ASSIGN_OR_RETURN(std::string call_id, StringField(item, "call_id", param));
    ASSIGN_OR_RETURN(std::string name, StringField(item, "name", param));
    const json* args = Get(item, "arguments");
    if (args == nullptr || !args->is_string()) {
      return Bad(param + ".arguments", "must be a JSON text (a string)");
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
    ASSIGN_OR_RETURN(std::string call_id, StringField(item, "call_id", param));
    const json* output = Get(item, "output");
    if (output == nullptr) return Bad(param + ".output", "is required");
    ASSIGN_OR_RETURN(std::string text, ContentText(*output, param + ".output"));
    Push({{"role", "tool"}, {"tool_call_id", std::move(call_id)}, {"content", std::move(text)}},
         param);
    return absl::OkStatus();
  }

  absl::Status AddReasoning(const json& item, const std::string& param) {
    if (Get(item, "encrypted_content")) {
      return Bad(param + ".encrypted_content", "is not served: kvserve encrypts no reasoning");
    }
    std::string text;
    for (const char* key : {"content", "summary"}) {
      const json* parts = Get(item, key);
      if (parts == nullptr) continue;
      if (!parts->is_array()) return Bad(absl::StrCat(param, ".", key), "must be a list");
      for (size_t j = 0; j < parts->size(); ++j) {
        const json& p = (*parts)[j];
        const json* t = p.is_object() ? Get(p, "text") : nullptr;
        if (t == nullptr || !t->is_string()) {
          return Bad(absl::StrCat(param, ".", key, "[", j, "].text"), "must be a string");
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

absl::Status TranslateInput(const json& o, const RequestLimits& limits, json& chat,
                            ResponsesRequest& r) {
  InputBuilder in;
  if (const json* ins = Get(o, "instructions")) {
    if (!ins->is_string()) return Bad("instructions", "must be a string");
    in.AddText("system", ins->get<std::string>(), "instructions");
  }
  const json* input = Get(o, "input");
  if (input == nullptr) return Bad("input", "is required");
  if (input->is_string()) {
    in.AddText("user", input->get<std::string>(), "input");
  } else if (input->is_array() && !input->empty()) {
    if (input->size() > static_cast<size_t>(limits.max_messages)) {
      return Bad("input", absl::StrCat("has ", input->size(), " items; the limit is ",
                                       limits.max_messages, " (--max-messages)"));
    }
    for (size_t i = 0; i < input->size(); ++i) RETURN_IF_ERROR(in.AddItem((*input)[i], i));
  } else {
    return Bad("input", "must be a string or a non-empty list of items");
  }
  chat["messages"] = in.Finish();
  r.message_origin = std::move(in.origin);
  return absl::OkStatus();
}

absl::Status TranslateTools(const json& o, json& chat) {
  if (const json* tools = Get(o, "tools")) {
    if (!tools->is_array()) return Bad("tools", "must be a list of tools");
    json out = json::array();
    for (size_t i = 0; i < tools->size(); ++i) {
      const json& t = (*tools)[i];
      const std::string param = absl::StrCat("tools[", i, "]");
      const json* type = t.is_object() ? Get(t, "type") : nullptr;
      if (type == nullptr || *type != "function") {
        const std::string name = type && type->is_string() ? type->get<std::string>() : "";
        return Bad(param + ".type", absl::StrCat("'", name.substr(0, 64),
                                                 "' is not served: kvserve serves function "
                                                 "tools (type \"function\")"));
      }
      json fn = json::object();
      for (const char* key : {"name", "description", "parameters", "strict"}) {
        if (t.contains(key)) fn[key] = t[key];
      }
      out.push_back({{"type", "function"}, {"function", std::move(fn)}});
    }
    chat["tools"] = std::move(out);
  }
  if (const json* choice = Get(o, "tool_choice")) {
    if (choice->is_string()) {
      chat["tool_choice"] = *choice;
    } else if (choice->is_object() && Get(*choice, "type") && (*choice)["type"] == "function") {
      const json* name = Get(*choice, "name");
      if (name == nullptr) return Bad("tool_choice.name", "is required");
      chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", *name}}}};
    } else {
      return Bad("tool_choice",
                 "must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", "
                 "\"name\": ...}; hosted tools and allowed_tools are not served");
    }
  }
  return absl::OkStatus();
}

absl::Status TranslateText(const json& o, json& chat) {
  const json* text = Get(o, "text");
  if (text == nullptr) return absl::OkStatus();
  if (!text->is_object()) return Bad("text", "must be an object");
  if (Get(*text, "verbosity")) return Bad("text.verbosity", "is not served; leave it unset");
  const json* format = Get(*text, "format");
  if (format == nullptr) return absl::OkStatus();
  const json* type = format->is_object() ? Get(*format, "type") : nullptr;
  if (type == nullptr) return Bad("text.format.type", "is required");
  if (*type == "text") return absl::OkStatus();
  if (*type == "json_object") {
    chat["response_format"] = {{"type", "json_object"}};
    return absl::OkStatus();
  }
  if (*type != "json_schema") {
    return Bad("text.format.type", "must be \"text\", \"json_object\" or \"json_schema\"");
  }
  json schema = json::object();
  for (const char* key : {"name", "schema", "strict", "description"}) {
    if (format->contains(key)) schema[key] = (*format)[key];
  }
  chat["response_format"] = {{"type", "json_schema"}, {"json_schema", std::move(schema)}};
  return absl::OkStatus();
}

absl::Status TranslateLogprobs(const json& o, json& chat, ResponsesRequest& r) {
  if (const json* include = Get(o, "include")) {
    if (!include->is_array()) return Bad("include", "must be a list");
    for (size_t j = 0; j < include->size(); ++j) {
      if ((*include)[j] != "message.output_text.logprobs") {
        return Bad(absl::StrCat("include[", j, "]"),
                   "only \"message.output_text.logprobs\" is served");
      }
      r.output_logprobs = true;
    }
  }
  const json* top = Get(o, "top_logprobs");
  if (top != nullptr && *top != 0) r.output_logprobs = true;
  if (r.output_logprobs) {
    chat["logprobs"] = true;
    chat["top_logprobs"] = top ? *top : json(0);
  }
  return absl::OkStatus();
}

// The request's fields as the response object repeats them, OpenAI's defaults filled in.
json EchoFields(const json& o) {
  auto value = [&](const char* key, json fallback) {
    const json* v = Get(o, key);
    return v ? *v : fallback;
  };
  json text = {{"format", {{"type", "text"}}}};
  if (const json* t = Get(o, "text"); t && Get(*t, "format")) text["format"] = (*t)["format"];
  return {{"instructions", value("instructions", nullptr)},
          {"max_output_tokens", value("max_output_tokens", nullptr)},
          {"metadata", value("metadata", json::object())},
          {"parallel_tool_calls", value("parallel_tool_calls", true)},
          {"previous_response_id", nullptr},
          {"reasoning", {{"effort", nullptr}, {"summary", nullptr}}},
          {"store", false},
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

// `message` with its leading parameter name replaced as `r`'s origins say.
std::string RenameParam(std::string_view message, const ResponsesRequest& r) {
  const size_t colon = message.find(':');
  std::string param(message.substr(0, colon == std::string_view::npos ? 0 : colon));
  const std::string_view rest = message.substr(param.size());
  auto replace_prefix = [&](std::string_view from, std::string_view to) {
    if (!absl::StartsWith(param, Sv(from))) return false;
    param = absl::StrCat(Sv(to), param.substr(from.size()));
    return true;
  };
  if (absl::StartsWith(param, "messages[")) {
    const size_t close = param.find(']');
    size_t k = 0;
    if (close != std::string::npos && absl::SimpleAtoi(param.substr(9, close - 9), &k) &&
        k < r.message_origin.size()) {
      param = absl::StrCat(r.message_origin[k], param.substr(close + 1));
    }
  } else if (param == "messages") {
    param = "input";
  } else if (!replace_prefix("max_tokens", "max_output_tokens") &&
             !replace_prefix("response_format.json_schema", "text.format") &&
             !replace_prefix("response_format", "text.format") &&
             absl::StartsWith(param, "tools[")) {
    const size_t fn = param.find("].function");
    if (fn != std::string::npos) param.erase(fn + 1, 9);
  }
  return absl::StrCat(param, Sv(rest));
}

}  // namespace

absl::StatusOr<ResponsesRequest> TranslateResponsesRequest(std::string_view body,
                                                           const RequestLimits& limits) {
  RETURN_IF_ERROR(CheckDepth(body));
  const json o = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (o.is_discarded()) return Bad("body", "is not valid JSON (or not valid UTF-8)");
  if (!o.is_object()) return Bad("body", "must be a JSON object");
  RETURN_IF_ERROR(RefuseUnserved(o));
  ResponsesRequest r;
  json chat = json::object();
  for (const char* key : kPassThrough) {
    if (o.contains(key)) chat[key] = o[key];
  }
  if (const json* max = Get(o, "max_output_tokens")) chat["max_tokens"] = *max;
  RETURN_IF_ERROR(TranslateInput(o, limits, chat, r));
  RETURN_IF_ERROR(TranslateTools(o, chat));
  RETURN_IF_ERROR(TranslateText(o, chat));
  RETURN_IF_ERROR(TranslateLogprobs(o, chat, r));
  if (const json* key = Get(o, "prompt_cache_key")) {
    if (!key->is_string()) return Bad("prompt_cache_key", "must be a string");
    r.prompt_cache_key = key->get<std::string>();
  }
  if (const json* m = Get(o, "metadata")) {
    if (!m->is_object() || m->size() > 16) {
      return Bad("metadata", "must be an object of at most 16 string values");
    }
    for (const auto& [key, value] : m->items()) {
      if (!value.is_string() || key.size() > 64 ||
          value.get_ref<const std::string&>().size() > 512) {
        return Bad("metadata", "keys are at most 64 characters, values strings of at most 512");
      }
    }
  }
  r.echo = EchoFields(o);
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

}  // namespace kvserve::router
