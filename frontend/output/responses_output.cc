#include "frontend/output/responses_output.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace kvserve::frontend {

using json = nlohmann::json;

void ResponsesOutput::Begin(std::string id, int64_t created, std::string model) {
  id_ = absl::StrCat("resp_", id);
  created_ = created;
  model_ = std::move(model);
}

void ResponsesOutput::Emit(json event) {
  event["sequence_number"] = sequence_++;
  const std::string type = event["type"];
  absl::StrAppend(&out_, "event: ", type, "\ndata: ", event.dump(), "\n\n");
}

json ResponsesOutput::PartJson(const Item& item, bool added) const {
  const std::string text = added ? "" : item.text;
  if (item.kind == Kind::kReasoning) return {{"type", "reasoning_text"}, {"text", text}};
  return {{"type", "output_text"},
          {"text", text},
          {"annotations", json::array()},
          {"logprobs", added ? json::array() : item.logprobs}};
}

json ResponsesOutput::ItemJson(const Item& item, bool added) const {
  const char* status = added ? "in_progress" : item.cut ? "incomplete" : "completed";
  switch (item.kind) {
    case Kind::kReasoning:
      return {{"type", "reasoning"},
              {"id", item.id},
              {"summary", json::array()},
              {"content", added ? json::array() : json::array({PartJson(item, false)})},
              {"status", status}};
    case Kind::kMessage:
      return {{"type", "message"},
              {"id", item.id},
              {"status", status},
              {"role", "assistant"},
              {"content", added ? json::array() : json::array({PartJson(item, false)})}};
    case Kind::kCall:
      return {{"type", "function_call"},
              {"id", item.id},
              {"call_id", item.call_id},
              {"name", item.name},
              {"arguments", added ? "" : item.text},
              {"status", status}};
  }
  return nullptr;
}

void ResponsesOutput::Open(Kind kind) {
  if (open_ >= 0 && items_[open_].kind == kind) return;
  CloseOpen();
  Item& item = items_.emplace_back();
  item.kind = kind;
  const size_t index = items_.size() - 1;
  item.id = absl::StrCat(kind == Kind::kReasoning ? "rs_" : "msg_", id_.substr(5), "_", index);
  open_ = static_cast<int>(index);
  Emit({{"type", "response.output_item.added"},
        {"output_index", index},
        {"item", ItemJson(item, true)}});
  Emit({{"type", "response.content_part.added"},
        {"item_id", item.id},
        {"output_index", index},
        {"content_index", 0},
        {"part", PartJson(item, true)}});
}

void ResponsesOutput::CloseOpen() {
  if (open_ < 0) return;
  Item& item = items_[open_];
  const bool reasoning = item.kind == Kind::kReasoning;
  json done = {{"type", reasoning ? "response.reasoning_text.done" : "response.output_text.done"},
               {"item_id", item.id},
               {"output_index", open_},
               {"content_index", 0},
               {"text", item.text}};
  if (!reasoning) done["logprobs"] = item.logprobs;
  Emit(std::move(done));
  Emit({{"type", "response.content_part.done"},
        {"item_id", item.id},
        {"output_index", open_},
        {"content_index", 0},
        {"part", PartJson(item, false)}});
  item.done = true;
  Emit({{"type", "response.output_item.done"},
        {"output_index", open_},
        {"item", ItemJson(item, false)}});
  open_ = -1;
}

std::string ResponsesOutput::Opening(const ApiUsage& /*usage*/) {
  const json response = ResponseJson("in_progress", json::array(), nullptr);
  Emit({{"type", "response.created"}, {"response", response}});
  Emit({{"type", "response.in_progress"}, {"response", response}});
  return std::exchange(out_, {});
}

std::string ResponsesOutput::Delta(const std::string& reasoning, const std::string& text,
                                   const json& logprobs, const std::vector<ParsedToolCall>& calls) {
  if (!reasoning.empty()) {
    Open(Kind::kReasoning);
    items_[open_].text += reasoning;
    Emit({{"type", "response.reasoning_text.delta"},
          {"item_id", items_[open_].id},
          {"output_index", open_},
          {"content_index", 0},
          {"delta", reasoning}});
  }
  if (!text.empty() || (logprobs_ && !logprobs.empty())) {
    Open(Kind::kMessage);
    Item& item = items_[open_];
    item.text += text;
    json entries = logprobs_ ? logprobs : json::array();
    for (const json& e : entries) item.logprobs.push_back(e);
    Emit({{"type", "response.output_text.delta"},
          {"item_id", item.id},
          {"output_index", open_},
          {"content_index", 0},
          {"delta", text},
          {"logprobs", std::move(entries)}});
  }
  for (const ParsedToolCall& call : calls) {
    CloseOpen();
    Item& item = items_.emplace_back();
    item.kind = Kind::kCall;
    const size_t index = items_.size() - 1;
    item.id = absl::StrCat("fc_", id_.substr(5), "_", index);
    item.call_id = call.id;
    item.name = call.name;
    Emit({{"type", "response.output_item.added"},
          {"output_index", index},
          {"item", ItemJson(item, true)}});
    item.text = call.arguments;
    Emit({{"type", "response.function_call_arguments.delta"},
          {"item_id", item.id},
          {"output_index", index},
          {"delta", call.arguments}});
    Emit({{"type", "response.function_call_arguments.done"},
          {"item_id", item.id},
          {"output_index", index},
          {"name", call.name},
          {"arguments", call.arguments}});
    item.done = true;
    Emit({{"type", "response.output_item.done"},
          {"output_index", index},
          {"item", ItemJson(item, false)}});
  }
  return std::exchange(out_, {});
}

void ResponsesOutput::EnsureAnswer() {
  for (const Item& item : items_) {
    if (item.kind != Kind::kReasoning) return;
  }
  Open(Kind::kMessage);
}

json ResponsesOutput::OutputJson() const {
  json output = json::array();
  for (const Item& item : items_) output.push_back(ItemJson(item, !item.done));
  return output;
}

json ResponsesOutput::ResponseJson(const std::string& status, const json& output,
                                   const json& usage) const {
  json r = {{"id", id_},        {"object", "response"}, {"created_at", created_},
            {"status", status}, {"error", nullptr},     {"incomplete_details", nullptr},
            {"model", model_},  {"output", output},     {"usage", usage}};
  for (const auto& [key, value] : echo_.items()) r[key] = value;
  return r;
}

json ResponsesOutput::Response(const ApiFinish& finish, const ApiUsage& usage) {
  const bool incomplete = finish.reason == "length";
  EnsureAnswer();
  if (incomplete && open_ >= 0 && items_[open_].kind == Kind::kMessage) items_[open_].cut = true;
  CloseOpen();
  json r = ResponseJson(incomplete ? "incomplete" : "completed", OutputJson(),
                        {{"input_tokens", usage.input},
                         {"input_tokens_details", {{"cached_tokens", usage.cached}}},
                         {"output_tokens", usage.output},
                         {"output_tokens_details", {{"reasoning_tokens", usage.reasoning}}},
                         {"total_tokens", usage.input + usage.output}});
  if (incomplete) r["incomplete_details"] = {{"reason", "max_output_tokens"}};
  if (on_response_) on_response_(r);
  return r;
}

std::string ResponsesOutput::Closing(const ApiFinish& finish, const ApiUsage& usage) {
  json r = Response(finish, usage);
  const std::string type =
      r["status"] == "incomplete" ? "response.incomplete" : "response.completed";
  Emit({{"type", type}, {"response", std::move(r)}});
  return std::exchange(out_, {});
}

std::string ResponsesOutput::Failed(const OpenAiError& error) {
  CloseOpen();
  const json body = json::parse(error.json, nullptr, false);
  const json& e = body.is_object() && body.contains("error") ? body["error"] : json::object();
  json r = ResponseJson("failed", OutputJson(), nullptr);
  r["error"] = {{"code", e.value("code", json("server_error"))},
                {"message", e.value("message", json("the request failed"))}};
  if (r["error"]["code"].is_null()) r["error"]["code"] = "server_error";
  Emit({{"type", "response.failed"}, {"response", std::move(r)}});
  return std::exchange(out_, {});
}

}  // namespace kvserve::frontend
