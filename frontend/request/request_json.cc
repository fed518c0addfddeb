#include "frontend/request/request_json.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/json_text.h"
#include "common/string_util.h"

namespace kvserve::frontend {

using json = nlohmann::json;

absl::Status BadParam(std::string_view param, std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(Sv(param), ": ", Sv(what)));
}

const json* Field(const json& o, const char* key) {
  if (!o.is_object()) return nullptr;
  auto it = o.find(key);
  return it == o.end() || it->is_null() ? nullptr : &*it;
}

namespace {

// InvalidArgument when `body` nests arrays and objects deeper than kMaxBodyDepth.
absl::Status CheckDepth(std::string_view body) {
  int depth = 0;
  JsonStringScan scan;
  for (char c : body) {
    if (scan.InString(c)) continue;
    if (c == '{' || c == '[') {
      if (++depth > kMaxBodyDepth) {
        return BadParam("body",
                        absl::StrCat("nests arrays and objects deeper than ", kMaxBodyDepth));
      }
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<json> ParseBodyObject(std::string_view body) {
  if (absl::Status s = CheckDepth(body); !s.ok()) return s;
  json o = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (o.is_discarded()) return BadParam("body", "is not valid JSON (or not valid UTF-8)");
  if (!o.is_object()) return BadParam("body", "must be a JSON object");
  return o;
}

absl::StatusOr<std::string> RequiredString(const json& o, const char* key,
                                           const std::string& param) {
  const json* v = Field(o, key);
  if (v == nullptr || !v->is_string() || v->get_ref<const std::string&>().empty()) {
    return BadParam(absl::StrCat(param, ".", key), "must be a non-empty string");
  }
  return v->get<std::string>();
}

void PassThrough(const json& o, std::initializer_list<const char*> extra, json& chat) {
  static constexpr const char* kShared[] = {"model",
                                            "temperature",
                                            "top_p",
                                            "top_k",
                                            "stream",
                                            "min_p",
                                            "seed",
                                            "request_id",
                                            "priority",
                                            "cache_salt",
                                            "repetition_penalty",
                                            "presence_penalty",
                                            "frequency_penalty"};
  for (const char* key : kShared) {
    if (o.contains(key)) chat[key] = o[key];
  }
  for (const char* key : extra) {
    if (o.contains(key)) chat[key] = o[key];
  }
}

absl::Status CheckMessageCount(const json& list, std::string_view param, std::string_view noun,
                               int max_messages) {
  if (list.size() <= static_cast<size_t>(max_messages)) return absl::OkStatus();
  return BadParam(param, absl::StrCat("has ", list.size(), " ", Sv(noun), "; the limit is ",
                                      max_messages, " (--max-messages)"));
}

absl::Status TranslateTools(const json& o, const ToolShape& shape, json& chat) {
  const json* tools = Field(o, "tools");
  if (tools == nullptr) return absl::OkStatus();
  if (!tools->is_array()) return BadParam("tools", "must be a list of tools");
  json out = json::array();
  for (size_t i = 0; i < tools->size(); ++i) {
    const json& t = (*tools)[i];
    const json* type = t.is_object() ? Field(t, "type") : nullptr;
    if (type == nullptr ? !shape.type_optional : *type != shape.type) {
      const std::string name = type && type->is_string() ? type->get<std::string>() : "";
      return BadParam(absl::StrCat("tools[", i, "].type"),
                      absl::StrCat("'", name.substr(0, 64), "' is not served: kvserve serves ",
                                   Sv(shape.served)));
    }
    json fn = json::object();
    for (const auto& [from, to] : shape.fields) {
      if (t.contains(from)) fn[to] = t[from];
    }
    out.push_back({{"type", "function"}, {"function", std::move(fn)}});
  }
  chat["tools"] = std::move(out);
  return absl::OkStatus();
}

std::string RenameChatParam(
    std::string_view message, const std::vector<std::string>& origin,
    std::string_view messages_param,
    std::initializer_list<std::pair<std::string_view, std::string_view>> prefixes,
    std::string_view parameters_name) {
  const size_t colon = message.find(':');
  std::string param(message.substr(0, colon == std::string_view::npos ? 0 : colon));
  const std::string_view rest = message.substr(param.size());
  if (absl::StartsWith(param, "messages[")) {
    const size_t close = param.find(']');
    size_t k = 0;
    if (close != std::string::npos && absl::SimpleAtoi(param.substr(9, close - 9), &k) &&
        k < origin.size()) {
      param = absl::StrCat(origin[k], param.substr(close + 1));
    }
    return absl::StrCat(param, Sv(rest));
  }
  if (param == "messages") return absl::StrCat(Sv(messages_param), Sv(rest));
  for (const auto& [from, to] : prefixes) {
    if (absl::StartsWith(param, Sv(from))) {
      return absl::StrCat(Sv(to), param.substr(from.size()), Sv(rest));
    }
  }
  if (absl::StartsWith(param, "tools[")) {
    if (const size_t fn = param.find("].function"); fn != std::string::npos) {
      param.erase(fn + 1, 9);  // ".function"
      if (const size_t p = param.find("].parameters"); p != std::string::npos) {
        param.replace(p + 2, 10, parameters_name);
      }
    }
  }
  return absl::StrCat(param, Sv(rest));
}

}  // namespace kvserve::frontend
