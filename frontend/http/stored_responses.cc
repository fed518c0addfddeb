// The Responses API's stored responses (stored_responses.h).
#include "frontend/http/stored_responses.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "common/string_util.h"
#include "frontend/output/openai_error.h"
#include "frontend/store/response_store.h"
#include "glog/logging.h"
#include "nlohmann/json.hpp"

namespace kvserve::frontend {
namespace {

using json = nlohmann::json;

// The API key a request was let in with ("" when the front takes none: one tenant).
std::string Tenant(const FrontContext& ctx, const HttpRequest& request) {
  if (ctx.options.api_keys.empty()) return "";
  absl::string_view key = request.authorization;
  if (!absl::ConsumePrefix(&key, "Bearer ")) key = request.api_key;
  return TenantOf(StdSv(absl::StripAsciiWhitespace(key)));
}

// The record of response `id`, parsed; NotFound naming the id when there is none.
absl::StatusOr<json> Record(const FrontContext& ctx, const std::string& tenant,
                            const std::string& id) {
  ASSIGN_OR_RETURN(std::optional<std::string> text, ctx.responses->Get(tenant, id));
  if (!text) {
    return absl::NotFoundError(absl::StrCat("no stored response '", id.substr(0, 128), "'"));
  }
  json record = json::parse(*text, nullptr, false);
  if (!record.is_object() || !record.contains("response") || !record["response"].is_object() ||
      !record.value("conversation", json::array()).is_array()) {
    return absl::InternalError(
        absl::StrCat("the stored response '", id.substr(0, 128), "' is not a kvserve record"));
  }
  return record;
}

// A query string's values by name ("a=1&b=x%20y"), '+' and %XX decoded.
std::vector<std::pair<std::string, std::string>> QueryPairs(absl::string_view query) {
  auto decode = [](absl::string_view s) {
    std::string out;
    for (size_t i = 0; i < s.size(); ++i) {
      int hex = 0;
      if (s[i] == '%' && i + 2 < s.size() && absl::SimpleHexAtoi(s.substr(i + 1, 2), &hex)) {
        out += static_cast<char>(hex);
        i += 2;
      } else {
        out += s[i] == '+' ? ' ' : s[i];
      }
    }
    return out;
  };
  std::vector<std::pair<std::string, std::string>> pairs;
  for (absl::string_view part : absl::StrSplit(query, '&', absl::SkipEmpty())) {
    const size_t eq = part.find('=');
    pairs.emplace_back(decode(part.substr(0, eq)),
                       eq == absl::string_view::npos ? "" : decode(part.substr(eq + 1)));
  }
  return pairs;
}

// A page of `items` as OpenAI lists them: limit (1-100, default 20), order (asc or desc, the
// default), after (an item id: the page starts past it).
absl::StatusOr<json> ItemsPage(const json& items, absl::string_view query) {
  int limit = 20;
  bool ascending = false;
  std::string after;
  for (const auto& [key, value] : QueryPairs(query)) {
    if (key == "limit") {
      if (!absl::SimpleAtoi(value, &limit) || limit < 1 || limit > 100) {
        return absl::InvalidArgumentError("limit: must be an integer from 1 to 100");
      }
    } else if (key == "order") {
      if (value != "asc" && value != "desc") {
        return absl::InvalidArgumentError("order: must be \"asc\" or \"desc\"");
      }
      ascending = value == "asc";
    } else if (key == "after") {
      after = value;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(key.substr(0, 64), ": is not served (limit, order and after are)"));
    }
  }
  std::vector<const json*> ordered;  // the items that are objects with an id (all we store)
  if (items.is_array()) {
    for (const json& item : items) {
      if (item.is_object() && item.contains("id") && item["id"].is_string())
        ordered.push_back(&item);
    }
  }
  if (!ascending) std::reverse(ordered.begin(), ordered.end());
  size_t start = 0;
  if (!after.empty()) {
    const auto it = std::find_if(ordered.begin(), ordered.end(),
                                 [&](const json* i) { return (*i)["id"] == after; });
    if (it == ordered.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("after: no input item '", after.substr(0, 128), "' in this response"));
    }
    start = it - ordered.begin() + 1;
  }
  json data = json::array();
  const size_t end = std::min(ordered.size(), start + static_cast<size_t>(limit));
  for (size_t i = start; i < end; ++i) data.push_back(*ordered[i]);
  return json{{"object", "list"},
              {"data", data},
              {"first_id", start < end ? (*ordered[start])["id"] : json(nullptr)},
              {"last_id", start < end ? (*ordered[end - 1])["id"] : json(nullptr)},
              {"has_more", end < ordered.size()}};
}

void RespondStatus(HttpConnection& conn, const absl::Status& s) {
  conn.RespondError(OpenAiErrorFromStatus(s, absl::IsNotFound(s) ? "not_found" : ""));
}

}  // namespace

ResponsesState StateFor(const FrontContext& ctx, const HttpRequest& request) {
  if (ctx.responses == nullptr) return {};
  return {.store = true,
          .conversation =
              [&ctx, tenant = Tenant(ctx, request)](const std::string& id) -> absl::StatusOr<json> {
            ASSIGN_OR_RETURN(json record, Record(ctx, tenant, id));
            return record.value("conversation", json::array());
          }};
}

void StoreWhenAnswered(const FrontContext& ctx, const HttpRequest& request,
                       const ResponsesRequest& r, ResponsesOutput& output) {
  if (!r.store || ctx.responses == nullptr) return;
  output.set_on_response([&ctx, tenant = Tenant(ctx, request), input = r.input_items,
                          previous = r.previous_items](const json& response) {
    json conversation = previous;
    for (const json& item : input) conversation.push_back(item);
    for (const json& item : response.value("output", json::array())) conversation.push_back(item);
    const json record = {
        {"response", response}, {"input_items", input}, {"conversation", std::move(conversation)}};
    const std::string id = response.value("id", "");
    if (absl::Status s = ctx.responses->Put(tenant, id, JsonBody(record)); !s.ok()) {
      LOG_EVERY_T(WARNING, 10) << "response " << id << " not stored: " << s;
    }
  });
}

void HandleStoredResponse(const FrontContext& ctx, HttpConnection& conn,
                          const HttpRequest& request) {
  absl::string_view rest = request.path;
  absl::ConsumePrefix(&rest, "/v1/responses/");
  const size_t slash = rest.find('/');
  const std::string id(rest.substr(0, slash));
  const absl::string_view call = slash == absl::string_view::npos ? "" : rest.substr(slash + 1);
  const std::string& method = request.method;
  const bool known = (call.empty() && (method == "GET" || method == "DELETE")) ||
                     (call == "input_items" && method == "GET") ||
                     (call == "cancel" && method == "POST");
  if (!known || id.empty()) {
    return conn.RespondError(MakeOpenAiError(
        404, "not_found", absl::StrCat("no route for ", method, " ", request.path.substr(0, 200))));
  }
  if (ctx.responses == nullptr) {
    return RespondStatus(
        conn, absl::NotFoundError("this server keeps no responses (--responses-store none)"));
  }
  const std::string tenant = Tenant(ctx, request);
  if (method == "DELETE") {
    absl::StatusOr<bool> deleted = ctx.responses->Delete(tenant, id);
    if (!deleted.ok()) return RespondStatus(conn, deleted.status());
    if (!*deleted) {
      return RespondStatus(
          conn, absl::NotFoundError(absl::StrCat("no stored response '", id.substr(0, 128), "'")));
    }
    return conn.Respond(200, JsonBody({{"id", id}, {"object", "response"}, {"deleted", true}}));
  }
  absl::StatusOr<json> record = Record(ctx, tenant, id);
  if (!record.ok()) return RespondStatus(conn, record.status());
  if (call == "cancel") {
    return RespondStatus(
        conn, absl::InvalidArgumentError("only background responses can be cancelled, and kvserve "
                                         "answers none in the background: this one has finished"));
  }
  if (call == "input_items") {
    absl::StatusOr<json> page = ItemsPage((*record)["input_items"], request.query);
    if (!page.ok()) return RespondStatus(conn, page.status());
    return conn.Respond(200, JsonBody(*page));
  }
  for (const auto& [key, value] : QueryPairs(request.query)) {
    if (key == "stream" && (value == "false" || value.empty())) continue;
    return RespondStatus(conn, absl::InvalidArgumentError(absl::StrCat(
                                   key.substr(0, 64),
                                   ": is not served when retrieving a response: it has "
                                   "finished, and is answered whole")));
  }
  conn.Respond(200, JsonBody((*record)["response"]));
}

}  // namespace kvserve::frontend
