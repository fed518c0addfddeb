// Helpers for the request translators that read a body with nlohmann::json (the Responses and
// Messages APIs, frontend/request/responses_request.h, frontend/request/messages_request.h): the
// body parsed with its nesting capped, fields read with null meaning absent, errors "param: what is
// wrong".
//
// Pure functions; any thread. The body is untrusted.
#ifndef KVSERVE_FRONTEND_REQUEST_REQUEST_JSON_H_
#define KVSERVE_FRONTEND_REQUEST_REQUEST_JSON_H_

#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace kvserve::frontend {

// The nesting of arrays and objects a body may have: the JSON library recurses when writing.
inline constexpr int kMaxBodyDepth = 128;

// InvalidArgument "param: what".
absl::Status BadParam(std::string_view param, std::string_view what);

// The field, or null when it is absent, JSON null, or `o` is not an object.
const nlohmann::json* Field(const nlohmann::json& o, const char* key);

// The body as a JSON object; InvalidArgument naming "body" when it is not valid JSON (or UTF-8),
// not an object, or nested deeper than kMaxBodyDepth.
absl::StatusOr<nlohmann::json> ParseBodyObject(std::string_view body);

// The non-empty string field `key` of `o`; InvalidArgument naming "param.key" otherwise.
absl::StatusOr<std::string> RequiredString(const nlohmann::json& o, const char* key,
                                           const std::string& param);

// Copies into `chat` the fields that mean the same there, as they are when present: the sampling
// parameters and vLLM's extras every translator shares, then `extra` (the API's own).
void PassThrough(const nlohmann::json& o, std::initializer_list<const char*> extra,
                 nlohmann::json& chat);

// InvalidArgument naming `param` when `list` has more than `max_messages` entries ("has N
// `noun`; the limit is M (--max-messages)"), the limit chat's own messages have.
absl::Status CheckMessageCount(const nlohmann::json& list, std::string_view param,
                               std::string_view noun, int max_messages);

// How an API writes a client function tool, for TranslateTools: the `type` such a tool has (or
// may leave out, when `type_optional`), what kvserve serves in the words of its refusal of any
// other type, and its fields by the name chat's function gives them.
struct ToolShape {
  std::string_view type;
  bool type_optional = false;
  std::string_view served;
  std::initializer_list<std::pair<const char*, const char*>> fields;
};

// `o`'s "tools" (if any) as chat's: {"type": "function", "function": {...}} each, into
// chat["tools"]; InvalidArgument naming tools[i] for another type of tool.
absl::Status TranslateTools(const nlohmann::json& o, const ToolShape& shape, nlohmann::json& chat);

// An error message about a translated chat request ("param: what") as the client's API names
// the field: messages[k] as origin[k] says, "messages" as `messages_param`, the first of
// `prefixes` (chat's name, the API's) that starts it, and tools[i].function.X as tools[i].X
// (tools[i].function.parameters as tools[i].`parameters_name`).
std::string RenameChatParam(
    std::string_view message, const std::vector<std::string>& origin,
    std::string_view messages_param,
    std::initializer_list<std::pair<std::string_view, std::string_view>> prefixes,
    std::string_view parameters_name = "parameters");

}  // namespace kvserve::frontend

#endif  // KVSERVE_FRONTEND_REQUEST_REQUEST_JSON_H_
