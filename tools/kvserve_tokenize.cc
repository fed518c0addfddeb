// kvserve-tokenize: encode and decode with a model's tokenizer, JSON lines in and out.
//
//   echo '{"text": "Hello world"}' | kvserve-tokenize --tokenizer DIR     -> {"ids":[9906,1917]}
//   echo '{"ids": [9906, 1917]}'   | kvserve-tokenize --tokenizer DIR     -> {"text":"Hello world"}
//   echo '{"messages": [{"role": "user", "content": "Hi"}]}' | kvserve-tokenize --tokenizer DIR
//                                                     -> {"text": "<chat prompt>", "ids": [...]}
//
// Per-line options: "add_special_tokens" (encode; default --add_special_tokens),
// "skip_special_tokens" (decode; default false), "add_generation_prompt" (chat; default true),
// "enable_thinking" (chat, chatml family), "tools" (chat: a list of tool objects; messages may
// hold "tool_calls"). A bad line gets {"error": "..."} and the tool goes
// on with the next one; it exits non-zero only for a bad flag or an unloadable tokenizer.
#include <iostream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/init.h"
#include "common/status_macros.h"
#include "common/tokenizer/chat_template.h"
#include "common/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, tokenizer, "",
          "Directory holding tokenizer.json (and tokenizer_config.json, for BOS/EOS and the chat "
          "template)");
ABSL_FLAG(bool, add_special_tokens, true,
          "Default for encoding: add the special tokens the tokenizer's post-processor asks for");

namespace kvserve {
namespace {

using json = nlohmann::ordered_json;  // tools keep their keys' order
using tokenizer::Tokenizer;

// An assistant message's "tool_calls" ({"function": {"name", "arguments"}}; arguments a JSON
// text or a JSON value).
absl::StatusOr<std::vector<tokenizer::ToolCall>> ToolCalls(const json& m, size_t i) {
  std::vector<tokenizer::ToolCall> calls;
  if (!m.contains("tool_calls")) return calls;
  for (const json& c : m["tool_calls"]) {
    if (!c.is_object() || !c.contains("function") || !c["function"].is_object() ||
        !c["function"].value("name", json()).is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat("messages[", i, "].tool_calls needs {\"function\": {\"name\": ...}}"));
    }
    const json& f = c["function"];
    const json arguments = f.value("arguments", json::object());
    calls.push_back({c.value("id", std::string()), f["name"].get<std::string>(),
                     arguments.is_string() ? arguments.get<std::string>() : arguments.dump()});
  }
  return calls;
}

absl::StatusOr<json> HandleMessages(const Tokenizer& tok, const json& request) {
  ASSIGN_OR_RETURN(tokenizer::ChatTemplate tmpl,
                   tokenizer::ChatTemplate::Detect(tok.chat_template(), tok.bos_token()));
  const json& list = request["messages"];
  if (!list.is_array()) return absl::InvalidArgumentError("'messages' must be an array");
  std::vector<tokenizer::ChatMessage> messages;
  for (size_t i = 0; i < list.size(); ++i) {
    const json& m = list[i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content") ||
        !m["content"].is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat("messages[", i, "] needs string 'role' and 'content'"));
    }
    tokenizer::ChatMessage msg{m["role"].get<std::string>(), m["content"].get<std::string>(), {}};
    if (m.contains("reasoning_content") && m["reasoning_content"].is_string()) {
      msg.reasoning_content = m["reasoning_content"].get<std::string>();
    }
    ASSIGN_OR_RETURN(msg.tool_calls, ToolCalls(m, i));
    messages.push_back(std::move(msg));
  }
  tokenizer::ChatRenderOptions options;
  if (request.contains("tools")) {
    if (!request["tools"].is_array()) return absl::InvalidArgumentError("'tools' must be an array");
    for (const json& tool : request["tools"]) options.tools.push_back(tool.dump());
  }
  options.add_generation_prompt = request.value("add_generation_prompt", true);
  if (request.contains("enable_thinking") && request["enable_thinking"].is_boolean()) {
    options.enable_thinking = request["enable_thinking"].get<bool>();
  }
  ASSIGN_OR_RETURN(std::string prompt, tmpl.Render(messages, options));
  // The rendered prompt already holds BOS and the role markers.
  ASSIGN_OR_RETURN(std::vector<int> ids, tok.Encode(prompt, /*add_special_tokens=*/false));
  return json{{"text", prompt}, {"ids", ids}};
}

absl::StatusOr<json> HandleLine(const Tokenizer& tok, const std::string& line) {
  json request = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (request.is_discarded() || !request.is_object()) {
    return absl::InvalidArgumentError("line is not a JSON object");
  }
  if (request.contains("text")) {
    if (!request["text"].is_string()) return absl::InvalidArgumentError("'text' must be a string");
    const json& add =
        request.value("add_special_tokens", json(absl::GetFlag(FLAGS_add_special_tokens)));
    if (!add.is_boolean())
      return absl::InvalidArgumentError("'add_special_tokens' must be a boolean");
    ASSIGN_OR_RETURN(std::vector<int> ids,
                     tok.Encode(request["text"].get_ref<const std::string&>(), add.get<bool>()));
    return json{{"ids", ids}};
  }
  if (request.contains("ids")) {
    const json& list = request["ids"];
    if (!list.is_array()) return absl::InvalidArgumentError("'ids' must be an array of integers");
    std::vector<int> ids;
    for (const json& v : list) {
      if (!v.is_number_integer() || v.get<int64_t>() < INT32_MIN || v.get<int64_t>() > INT32_MAX) {
        return absl::InvalidArgumentError("'ids' must be an array of 32-bit integers");
      }
      ids.push_back(v.get<int>());
    }
    const json& skip = request.value("skip_special_tokens", json(false));
    if (!skip.is_boolean())
      return absl::InvalidArgumentError("'skip_special_tokens' must be a boolean");
    ASSIGN_OR_RETURN(std::string text, tok.Decode(ids, skip.get<bool>()));
    return json{{"text", text}};
  }
  if (request.contains("messages")) return HandleMessages(tok, request);
  return absl::InvalidArgumentError("a line needs 'text', 'ids' or 'messages'");
}

int Main() {
  const std::string dir = absl::GetFlag(FLAGS_tokenizer);
  if (dir.empty()) {
    std::cerr << "kvserve-tokenize: --tokenizer DIR is required\n";
    return 2;
  }
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromDirectory(dir);
  if (!tok.ok()) {
    std::cerr << "kvserve-tokenize: " << tok.status().message() << "\n";
    return 1;
  }
  std::ios::sync_with_stdio(false);
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    absl::StatusOr<json> reply = HandleLine(**tok, line);
    json out = reply.ok() ? *reply : json{{"error", std::string(reply.status().message())}};
    std::cout << out.dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
    std::cout.flush();
  }
  return 0;
}

}  // namespace
}  // namespace kvserve

int main(int argc, char** argv) {
  kvserve::InitProgram(argc, argv,
                       "kvserve-tokenize --tokenizer DIR < lines.jsonl: encode {\"text\"}, decode "
                       "{\"ids\"} or render {\"messages\"}, one JSON line out per line in");
  return kvserve::Main();
}
