#include "frontend/request/openai_request.h"

#include <algorithm>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "common/string_util.h"
#include "frontend/request/request_fields.h"
#include "nlohmann/json.hpp"
#include "simdjson.h"

namespace kvserve::frontend {
namespace {
namespace pb = kvserve::v1;

using request_fields::Bad;
using request_fields::Bool;
using request_fields::element;
using request_fields::Field;
using request_fields::Integer;
using request_fields::LaxBool;
using request_fields::NestedBool;
using request_fields::NonEmptyArray;
using request_fields::Number;
using request_fields::object;
using request_fields::String;
using request_fields::TooLong;
using request_fields::Unserved;

// An assistant message's tool_calls: [{"id", "type": "function", "function": {"name",
// "arguments"}}], arguments a JSON text (OpenAI's) or an object.
absl::Status ParseToolCalls(object mo, const std::string& param, tokenizer::ChatMessage* msg) {
  auto e = Field(mo, "tool_calls");
  if (!e) return absl::OkStatus();
  simdjson::dom::array calls;
  if (e->get_array().get(calls) != simdjson::SUCCESS) {
    return Bad(param + ".tool_calls", "must be a list of tool calls");
  }
  size_t j = 0;
  for (element c : calls) {
    const std::string call_param = absl::StrCat(param, ".tool_calls[", j++, "]");
    object co, fo;
    if (c.get_object().get(co) != simdjson::SUCCESS ||
        co["function"].get(fo) != simdjson::SUCCESS) {
      return Bad(call_param, "must be an object with a \"function\" object");
    }
    tokenizer::ToolCall call;
    ASSIGN_OR_RETURN(call.id, String(co, "id"));
    ASSIGN_OR_RETURN(call.name, String(fo, "name"));
    if (call.name.empty()) return Bad(call_param + ".function.name", "is required");
    std::string_view text;
    if (auto a = Field(fo, "arguments"); !a) {
      call.arguments = "{}";
    } else if (a->get_string().get(text) == simdjson::SUCCESS) {
      simdjson::dom::parser parser;
      element parsed;
      if (parser.parse(simdjson::padded_string(text)).get(parsed) != simdjson::SUCCESS) {
        return Bad(call_param + ".function.arguments", "is not a JSON text");
      }
      call.arguments = std::string(text);
    } else if (a->is_object()) {
      call.arguments = simdjson::minify(*a);
    } else {
      return Bad(call_param + ".function.arguments", "must be a JSON text (a string)");
    }
    msg->tool_calls.push_back(std::move(call));
  }
  return absl::OkStatus();
}

absl::Status ParseMessages(object o, const RequestLimits& limits, ParsedRequest* r) {
  auto e = Field(o, "messages");
  simdjson::dom::array arr;
  if (!e || e->get_array().get(arr) != simdjson::SUCCESS || arr.size() == 0) {
    return Bad("messages", "must be a non-empty array");
  }
  if (arr.size() > static_cast<size_t>(limits.max_messages)) {
    return Bad("messages", absl::StrCat("has ", arr.size(), " messages; the limit is ",
                                        limits.max_messages, " (--max-messages)"));
  }
  int64_t bytes = 0;
  size_t i = 0;
  for (element m : arr) {
    const std::string param = absl::StrCat("messages[", i++, "]");
    object mo;
    if (m.get_object().get(mo) != simdjson::SUCCESS) return Bad(param, "must be an object");
    tokenizer::ChatMessage msg;
    ASSIGN_OR_RETURN(msg.role, String(mo, "role"));
    if (msg.role.empty()) return Bad(param + ".role", "is required");
    auto content = Field(mo, "content");
    std::string_view text;
    simdjson::dom::array parts;
    if (!content) {
      msg.content = "";
    } else if (content->get_string().get(text) == simdjson::SUCCESS) {
      msg.content = std::string(text);
    } else if (content->get_array().get(parts) == simdjson::SUCCESS) {
      // [{"type": "text", "text": "..."}]: text parts are joined; other types are not served.
      for (element p : parts) {
        object po;
        std::string_view type, part_text;
        if (p.get_object().get(po) != simdjson::SUCCESS ||
            po["type"].get(type) != simdjson::SUCCESS || type != "text" ||
            po["text"].get(part_text) != simdjson::SUCCESS) {
          return Bad(param + ".content", "only text parts are supported");
        }
        msg.content += std::string(part_text);
      }
    } else {
      return Bad(param + ".content", "must be a string or an array of text parts");
    }
    if (auto rc = Field(mo, "reasoning_content")) {
      std::string_view rt;
      if (rc->get_string().get(rt) == simdjson::SUCCESS) msg.reasoning_content = std::string(rt);
    }
    RETURN_IF_ERROR(ParseToolCalls(mo, param, &msg));
    ASSIGN_OR_RETURN(msg.tool_call_id, String(mo, "tool_call_id"));
    bytes += static_cast<int64_t>(msg.content.size() + msg.reasoning_content.value_or("").size());
    for (const tokenizer::ToolCall& c : msg.tool_calls) {
      bytes += static_cast<int64_t>(c.name.size() + c.arguments.size());
    }
    if (bytes > limits.max_prompt_bytes) return TooLong("messages", bytes, limits);
    r->messages.push_back(std::move(msg));
  }
  return absl::OkStatus();
}

// One prompt's token ids, `param` naming it in errors.
absl::Status AddIdsPrompt(simdjson::dom::array arr, const std::string& param,
                          const RequestLimits& limits, ParsedRequest* r) {
  if (arr.size() == 0) return Bad(param, "must not be empty");
  if (static_cast<int64_t>(arr.size()) > limits.max_prompt_ids) {
    return Bad(param, absl::StrCat("has ", arr.size(), " token ids; the model's context holds ",
                                   limits.max_prompt_ids));
  }
  PromptInput& p = r->prompts.emplace_back();
  p.ids.reserve(arr.size());
  for (element t : arr) {
    int64_t id;
    if (t.get_int64().get(id) != simdjson::SUCCESS || id < 0 || id > INT32_MAX) {
      return Bad(param, "token ids must be non-negative 32-bit integers");
    }
    p.ids.push_back(static_cast<int32_t>(id));
  }
  return absl::OkStatus();
}

// "prompt": a string, a list of token ids, or a list of either (several prompts).
absl::Status ParsePrompt(object o, const RequestLimits& limits, ParsedRequest* r) {
  auto e = Field(o, "prompt");
  if (!e) return Bad("prompt", "is required");
  std::string_view text;
  simdjson::dom::array arr;
  if (e->get_string().get(text) == simdjson::SUCCESS) {
    if (static_cast<int64_t>(text.size()) > limits.max_prompt_bytes) {
      return TooLong("prompt", static_cast<int64_t>(text.size()), limits);
    }
    r->prompts.push_back({std::string(text), {}});
    return absl::OkStatus();
  }
  constexpr const char* kShape =
      "must be a string, a list of token ids, or a list of strings or of token-id lists";
  if (e->get_array().get(arr) != simdjson::SUCCESS || arr.size() == 0) return Bad("prompt", kShape);
  element first = arr.at(0);
  if (first.is_int64() || first.is_uint64()) return AddIdsPrompt(arr, "prompt", limits, r);
  if (arr.size() > static_cast<size_t>(limits.max_prompts)) {
    return Bad("prompt", absl::StrCat("has ", arr.size(), " prompts; the limit is ",
                                      limits.max_prompts, " (--max-prompts)"));
  }
  int64_t bytes = 0;
  size_t i = 0;
  for (element p : arr) {
    const std::string param = absl::StrCat("prompt[", i++, "]");
    simdjson::dom::array ids;
    if (p.get_string().get(text) == simdjson::SUCCESS) {
      bytes += static_cast<int64_t>(text.size());
      if (bytes > limits.max_prompt_bytes) return TooLong("prompt", bytes, limits);
      r->prompts.push_back({std::string(text), {}});
    } else if (p.get_array().get(ids) == simdjson::SUCCESS) {
      RETURN_IF_ERROR(AddIdsPrompt(ids, param, limits, r));
    } else {
      return Bad(param, "must be a string or a list of token ids");
    }
  }
  return absl::OkStatus();
}

// The sampling fields: temperature, top_p, top_k, min_p, seed, n, logprobs.
absl::Status ParseSampling(object o, bool chat, ParsedRequest* r) {
  pb::SamplingParams& s = r->sampling;
  ASSIGN_OR_RETURN(double t, Number(o, "temperature", 1.0, 0.0, 2.0));
  s.set_temperature(static_cast<float>(t));
  ASSIGN_OR_RETURN(double top_p, Number(o, "top_p", 1.0, 1e-9, 1.0));
  s.set_top_p(static_cast<float>(top_p));
  ASSIGN_OR_RETURN(int64_t top_k, Integer(o, "top_k", -1, -1, INT32_MAX));
  s.set_top_k(static_cast<int32_t>(top_k));
  ASSIGN_OR_RETURN(double min_p, Number(o, "min_p", 0.0, 0.0, 1.0));
  s.set_min_p(static_cast<float>(min_p));
  if (Field(o, "seed")) {
    ASSIGN_OR_RETURN(int64_t seed, Integer(o, "seed", 0, INT64_MIN, INT64_MAX));
    s.set_seed(static_cast<uint64_t>(seed));
  }
  ASSIGN_OR_RETURN(int64_t n, Integer(o, "n", 1, 1, 128));
  s.set_n(static_cast<int32_t>(n));
  if (chat) {
    // "true" as a string too: vLLM's validation coerces it (its test_top_logprobs sends it).
    ASSIGN_OR_RETURN(bool want, LaxBool(o, "logprobs", false));
    if (want) {
      // -1: the whole vocabulary (vLLM's), within --max-logprobs (CheckLogprobBudget).
      ASSIGN_OR_RETURN(int64_t top, Integer(o, "top_logprobs", 0, -1, INT32_MAX));
      s.set_logprobs(static_cast<int32_t>(top));
    }
  } else if (Field(o, "logprobs")) {
    ASSIGN_OR_RETURN(int64_t top, Integer(o, "logprobs", 0, 0, INT32_MAX));
    s.set_logprobs(static_cast<int32_t>(top));
  }
  return absl::OkStatus();
}

absl::StatusOr<int32_t> TokenId(element e, std::string_view param) {
  int64_t id;
  if (e.get_int64().get(id) != simdjson::SUCCESS || id < 0 || id > INT32_MAX) {
    return Bad(param, "token ids must be non-negative 32-bit integers");
  }
  return static_cast<int32_t>(id);
}

// The list of token ids at `key`, at most `limit` of them (the flag `flag` sets it).
absl::Status TokenIds(object o, const char* key, int limit, const char* flag,
                      std::vector<int32_t>* out) {
  auto e = Field(o, key);
  if (!e) return absl::OkStatus();
  simdjson::dom::array ids;
  if (e->get_array().get(ids) != simdjson::SUCCESS) return Bad(key, "must be a list of token ids");
  if (ids.size() > static_cast<size_t>(limit)) {
    return Bad(key,
               absl::StrCat("has ", ids.size(), " ids; the limit is ", limit, " (", flag, ")"));
  }
  for (element id : ids) {
    ASSIGN_OR_RETURN(int32_t v, TokenId(id, key));
    out->push_back(v);
  }
  return absl::OkStatus();
}

// vLLM's logprob_token_ids (PR #43463): these ids' logprobs at each generated position in place
// of the top alternatives. Needs logprobs; at most 20 ids. An empty list is refused, as vLLM's
// fix PR #49320 does, rather than read as "the top ones" without a word.
constexpr int kMaxLogprobTokenIds = 20;  // the worker's (kernels::kMaxTopLogprobs)

absl::Status ParseLogprobTokenIds(object o, bool chat, ParsedRequest* r) {
  if (!Field(o, "logprob_token_ids")) return absl::OkStatus();
  std::vector<int32_t> ids;
  RETURN_IF_ERROR(
      TokenIds(o, "logprob_token_ids", kMaxLogprobTokenIds, "as --max-logprobs in vLLM", &ids));
  if (ids.empty()) {
    return Bad("logprob_token_ids", "must not be empty: leave it unset for the top logprobs");
  }
  if (!r->logprobs()) {
    return Bad("logprob_token_ids", chat ? "needs logprobs: true" : "needs logprobs set");
  }
  if (r->max_tokens == 0) {
    return Bad("logprob_token_ids",
               "scores generated tokens; with echo and max_tokens 0 there are none");
  }
  r->sampling.mutable_logprob_token_ids()->Add(ids.begin(), ids.end());
  return absl::OkStatus();
}

// logit_bias: {"token id": bias}, OpenAI's shape (keys are ids written as strings).
absl::Status ParseLogitBias(object o, const RequestLimits& limits, ParsedRequest* r) {
  auto e = Field(o, "logit_bias");
  if (!e) return absl::OkStatus();
  object bias;
  if (e->get_object().get(bias) != simdjson::SUCCESS) {
    return Bad("logit_bias", "must be an object mapping token ids to biases");
  }
  if (bias.size() > static_cast<size_t>(limits.max_token_list_ids)) {
    return Bad("logit_bias", absl::StrCat("has ", bias.size(), " entries; the limit is ",
                                          limits.max_token_list_ids, " (--max-token-list-ids)"));
  }
  // Every key that is not a token id is named at once (vLLM's test_chat_logit_bias_multiple_
  // non_integer_keys), the first 16 of them.
  std::vector<std::string> bad_keys;
  size_t more_bad = 0;
  for (auto [key, value] : bias) {
    int32_t id;
    if (absl::SimpleAtoi(Sv(key), &id) && id >= 0) continue;
    if (bad_keys.size() < 16) {
      bad_keys.push_back(absl::StrCat("'", Sv(key.substr(0, 32)), "'"));
    } else {
      ++more_bad;
    }
  }
  if (!bad_keys.empty()) {
    const bool one = bad_keys.size() == 1 && more_bad == 0;
    return Bad("logit_bias",
               absl::StrCat(one ? "key " : "keys ", absl::StrJoin(bad_keys, ", "),
                            more_bad > 0 ? absl::StrCat(" and ", more_bad, " more") : "",
                            one ? " is not a token id" : " are not token ids"));
  }
  for (auto [key, value] : bias) {
    int32_t id;
    if (!absl::SimpleAtoi(Sv(key), &id)) continue;  // cannot happen: checked above
    double v;
    if (value.get_double().get(v) != simdjson::SUCCESS) {
      int64_t i;
      if (value.get_int64().get(i) != simdjson::SUCCESS) {
        return Bad("logit_bias", absl::StrCat("the bias of token ", id, " must be a number"));
      }
      v = static_cast<double>(i);
    }
    if (!(v >= -100 && v <= 100)) {
      return Bad("logit_bias",
                 absl::StrCat("the bias of token ", id, " must be in [-100, 100], got ", v));
    }
    // Repeated ids: the last bias wins (what a JSON object's duplicate keys mean to most readers).
    (*r->sampling.mutable_logit_bias())[id] = static_cast<float>(v);
  }
  return absl::OkStatus();
}

// The logits adjustments: penalties, min_tokens, logit_bias, bad_words, allowed_token_ids.
absl::Status ParseAdjustments(object o, const RequestLimits& limits, ParsedRequest* r) {
  pb::SamplingParams& s = r->sampling;
  ASSIGN_OR_RETURN(double presence, Number(o, "presence_penalty", 0.0, -2.0, 2.0));
  s.set_presence_penalty(static_cast<float>(presence));
  ASSIGN_OR_RETURN(double frequency, Number(o, "frequency_penalty", 0.0, -2.0, 2.0));
  s.set_frequency_penalty(static_cast<float>(frequency));
  const double huge = std::numeric_limits<float>::max();
  ASSIGN_OR_RETURN(double repetition, Number(o, "repetition_penalty", 1.0, -huge, huge));
  if (!(repetition > 0))
    return Bad("repetition_penalty", absl::StrCat("must be > 0, got ", repetition));
  s.set_repetition_penalty(static_cast<float>(repetition));
  ASSIGN_OR_RETURN(int64_t min_tokens, Integer(o, "min_tokens", 0, 0, INT32_MAX));
  s.set_min_tokens(static_cast<int32_t>(min_tokens));
  RETURN_IF_ERROR(ParseLogitBias(o, limits, r));
  std::vector<int32_t> allowed;
  RETURN_IF_ERROR(TokenIds(o, "allowed_token_ids", limits.max_token_list_ids,
                           "--max-token-list-ids", &allowed));
  s.mutable_allowed_token_ids()->Add(allowed.begin(), allowed.end());
  if (auto e = Field(o, "bad_words")) {
    simdjson::dom::array words;
    if (e->get_array().get(words) != simdjson::SUCCESS) {
      return Bad("bad_words", "must be a list of strings");
    }
    if (words.size() > static_cast<size_t>(limits.max_stop_strings)) {
      return Bad("bad_words", absl::StrCat("has ", words.size(), " words; the limit is ",
                                           limits.max_stop_strings, " (--max-stop-strings)"));
    }
    for (element w : words) {
      std::string_view word;
      if (w.get_string().get(word) != simdjson::SUCCESS)
        return Bad("bad_words", "must hold strings");
      if (word.size() > static_cast<size_t>(limits.max_stop_string_bytes)) {
        return Bad("bad_words",
                   absl::StrCat("a word has ", word.size(), " bytes; the limit is ",
                                limits.max_stop_string_bytes, " (--max-stop-string-bytes)"));
      }
      r->bad_words.emplace_back(word);
    }
  }
  return absl::OkStatus();
}

// The stop conditions: "stop" (a string or a list of them) and "stop_token_ids".
absl::Status AddStop(std::string_view one, const RequestLimits& limits, ParsedRequest* r) {
  if (one.empty()) return absl::OkStatus();
  if (one.size() > static_cast<size_t>(limits.max_stop_string_bytes)) {
    return Bad("stop", absl::StrCat("a stop string has ", one.size(), " bytes; the limit is ",
                                    limits.max_stop_string_bytes, " (--max-stop-string-bytes)"));
  }
  r->stop.emplace_back(one);
  return absl::OkStatus();
}

absl::Status ParseStops(object o, const RequestLimits& limits, ParsedRequest* r) {
  if (auto s = Field(o, "stop")) {
    std::string_view one;
    simdjson::dom::array many;
    if (s->get_string().get(one) == simdjson::SUCCESS) {
      RETURN_IF_ERROR(AddStop(one, limits, r));
    } else if (s->get_array().get(many) == simdjson::SUCCESS) {
      if (many.size() > static_cast<size_t>(limits.max_stop_strings)) {
        return Bad("stop", absl::StrCat("has ", many.size(), " strings; the limit is ",
                                        limits.max_stop_strings, " (--max-stop-strings)"));
      }
      for (element e : many) {
        if (e.get_string().get(one) != simdjson::SUCCESS) return Bad("stop", "must hold strings");
        RETURN_IF_ERROR(AddStop(one, limits, r));
      }
    } else {
      return Bad("stop", "must be a string or a list of strings");
    }
  }
  return TokenIds(o, "stop_token_ids", limits.max_stop_token_ids, "--max-stop-token-ids",
                  &r->stop_token_ids);
}

// The chat's messages and template options, or the completion's prompt.
absl::Status ParseInput(object o, bool chat, const RequestLimits& limits, ParsedRequest* r) {
  if (!chat) {
    RETURN_IF_ERROR(ParsePrompt(o, limits, r));
    ASSIGN_OR_RETURN(r->add_special_tokens, Bool(o, "add_special_tokens", true));
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(ParseMessages(o, limits, r));
  ASSIGN_OR_RETURN(r->add_generation_prompt, Bool(o, "add_generation_prompt", true));
  ASSIGN_OR_RETURN(r->continue_final_message, Bool(o, "continue_final_message", false));
  if (r->continue_final_message && r->add_generation_prompt) {
    return Bad("continue_final_message",
               "cannot be true with add_generation_prompt true (as in vLLM): set "
               "add_generation_prompt to false");
  }
  if (r->continue_final_message && (r->messages.empty() || r->messages.back().content.empty())) {
    return Bad("continue_final_message", "needs a final message with text to continue");
  }
  if (auto kw = Field(o, "chat_template_kwargs")) {
    object ko;
    if (kw->get_object().get(ko) != simdjson::SUCCESS) {
      return Bad("chat_template_kwargs", "must be an object");
    }
    for (auto [key, value] : ko) {  // what kvserve's templates read; the rest is refused
      if (key != "enable_thinking") {
        return Bad(absl::StrCat("chat_template_kwargs.", Sv(key.substr(0, 64))),
                   "is not a variable kvserve's chat templates read (enable_thinking is)");
      }
    }
    if (Field(ko, "enable_thinking")) {
      ASSIGN_OR_RETURN(
          r->enable_thinking,
          NestedBool(ko, "enable_thinking", "chat_template_kwargs.enable_thinking", true));
    }
  }
  return absl::OkStatus();
}

// echo (completions': the prompt; chat's, vLLM's: the last message when it has the answer's
// role) and vLLM's prompt_logprobs.
absl::Status ParseEcho(object o, ParsedRequest* r) {
  ASSIGN_OR_RETURN(r->echo, Bool(o, "echo", false));
  if (Field(o, "prompt_logprobs")) {
    ASSIGN_OR_RETURN(int64_t top, Integer(o, "prompt_logprobs", 0, -1, INT32_MAX));
    r->prompt_logprobs = static_cast<int>(top);
  }
  return absl::OkStatus();
}

// stream_options: include_usage, and continuous_usage_stats (vLLM's: usage in every chunk;
// include_usage then defaults to true; with include_usage false it has no effect, as vLLM
// defines it: no usage at all); any other key is refused by name. Only with stream: true (vLLM
// refuses it otherwise).
absl::Status ParseStreamOptions(element so, ParsedRequest* r) {
  object soo;
  if (so.get_object().get(soo) != simdjson::SUCCESS) {
    return Bad("stream_options", "must be an object");
  }
  if (!r->stream) return Bad("stream_options", "is only for stream: true (as in vLLM)");
  for (auto [key, value] : soo) {
    if (key != "include_usage" && key != "continuous_usage_stats") {
      return Bad(absl::StrCat("stream_options.", Sv(key.substr(0, 64))),
                 "is not a stream option kvserve serves (include_usage is)");
    }
  }
  ASSIGN_OR_RETURN(bool continuous, NestedBool(soo, "continuous_usage_stats",
                                               "stream_options.continuous_usage_stats", false));
  ASSIGN_OR_RETURN(bool include,
                   NestedBool(soo, "include_usage", "stream_options.include_usage", continuous));
  r->include_usage = include;
  r->continuous_usage = continuous && include;
  return absl::OkStatus();
}

// Streaming, output and routing options: stream, stream_options, ignore_eos, user, cache_salt,
// truncate_prompt_tokens, truncation_side, skip_special_tokens, include_stop_str_in_output,
// priority.
absl::Status ParseOptions(object o, const RequestLimits& limits, ParsedRequest* r) {
  ASSIGN_OR_RETURN(r->stream, Bool(o, "stream", false));
  if (auto so = Field(o, "stream_options")) RETURN_IF_ERROR(ParseStreamOptions(*so, r));
  ASSIGN_OR_RETURN(bool ignore_eos, Bool(o, "ignore_eos", false));
  r->sampling.set_ignore_eos(ignore_eos);
  ASSIGN_OR_RETURN(r->user, String(o, "user"));
  ASSIGN_OR_RETURN(r->request_id, String(o, "request_id"));
  if (r->request_id.size() > 256) return Bad("request_id", "must be at most 256 bytes");
  ASSIGN_OR_RETURN(r->cache_salt, String(o, "cache_salt"));
  if (Field(o, "cache_salt") && r->cache_salt.empty()) {
    return Bad("cache_salt", "must be a non-empty string when given (as in vLLM)");
  }
  if (Field(o, "truncate_prompt_tokens")) {
    ASSIGN_OR_RETURN(int64_t keep, Integer(o, "truncate_prompt_tokens", 0, 1, INT32_MAX));
    r->truncate_prompt_tokens = static_cast<int>(keep);
  }
  ASSIGN_OR_RETURN(const std::string side, String(o, "truncation_side"));
  if (!side.empty() && side != "left" && side != "right") {
    return Bad("truncation_side",
               "must be \"left\" (keep the last tokens) or \"right\" (the first)");
  }
  r->truncate_right = side == "right";
  ASSIGN_OR_RETURN(r->skip_special_tokens, Bool(o, "skip_special_tokens", true));
  ASSIGN_OR_RETURN(r->return_tokens_as_token_ids,
                   Bool(o, "return_tokens_as_token_ids", limits.tokens_as_token_ids));
  ASSIGN_OR_RETURN(r->return_token_ids, Bool(o, "return_token_ids", false));
  ASSIGN_OR_RETURN(r->include_stop_str_in_output, Bool(o, "include_stop_str_in_output", false));
  ASSIGN_OR_RETURN(int64_t priority, Integer(o, "priority", 0, INT32_MIN, INT32_MAX));
  r->priority = static_cast<int>(priority);
  return absl::OkStatus();
}

// One parser per handler thread, reused: a parser of its own per request allocated its buffers
// (several bytes per body byte) every time. One grown past kKeepBytes is let go at the next use.
simdjson::dom::parser& ThreadParser() {
  constexpr size_t kKeepBytes = 4u << 20;
  thread_local simdjson::dom::parser parser;
  if (parser.capacity() > kKeepBytes) parser = simdjson::dom::parser();
  return parser;
}

}  // namespace

absl::StatusOr<ParsedRequest> ParseCompletionRequest(std::string_view body, bool chat,
                                                     const RequestLimits& limits) {
  if (!simdjson::validate_utf8(body.data(), body.size())) return Bad("body", "is not valid UTF-8");
  simdjson::dom::parser& parser = ThreadParser();
  element root;
  if (auto err = parser.parse(body.data(), body.size()).get(root)) {
    return Bad("body", absl::StrCat("is not valid JSON (", simdjson::error_message(err), ")"));
  }
  object o;
  if (root.get_object().get(o) != simdjson::SUCCESS) return Bad("body", "must be a JSON object");
  ParsedRequest r;
  r.chat = chat;
  ASSIGN_OR_RETURN(r.model, String(o, "model"));
  if (r.model.empty()) return Bad("model", "is required");
  RETURN_IF_ERROR(ParseInput(o, chat, limits, &r));
  RETURN_IF_ERROR(ParseEcho(o, &r));
  const char* max_key =
      chat && Field(o, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  r.max_tokens_given = Field(o, max_key).has_value();
  // max_tokens 0 with echo scores the prompt and generates nothing (vLLM's rule, completions').
  ASSIGN_OR_RETURN(int64_t max_tokens, Integer(o, max_key, 16, r.echo && !chat ? 0 : 1, INT32_MAX));
  r.max_tokens = static_cast<int>(max_tokens);
  RETURN_IF_ERROR(ParseSampling(o, chat, &r));
  RETURN_IF_ERROR(ParseLogprobTokenIds(o, chat, &r));
  RETURN_IF_ERROR(ParseStops(o, limits, &r));
  RETURN_IF_ERROR(ParseOptions(o, limits, &r));
  RETURN_IF_ERROR(ParseAdjustments(o, limits, &r));
  if (r.sampling.min_tokens() > r.max_tokens && r.max_tokens_given) {
    return Bad("min_tokens", absl::StrCat("must be at most ", max_key, " (", r.max_tokens,
                                          "), got ", r.sampling.min_tokens()));
  }
  RETURN_IF_ERROR(request_fields::RefuseUnserved(o, chat, r.n()));
  RETURN_IF_ERROR(request_fields::ParseConstraint(o, limits, &r));
  if (chat) RETURN_IF_ERROR(request_fields::ParseTools(o, limits, &r));
  if (r.prompt_logprobs && r.stream) {
    return Bad("prompt_logprobs", "is not served with stream: true (as in vLLM); use echo");
  }
  return r;
}

absl::Status CheckLogprobBudget(const ParsedRequest& r, int64_t max_tokens,
                                const RequestLimits& limits, int64_t prompt_tokens, int64_t vocab) {
  // vLLM's max_logprobs: -1 (the whole vocabulary) counts as the vocabulary's size.
  auto count = [&](int top) { return top == -1 ? vocab : int64_t{top}; };
  const auto over_max = [&](std::string_view param, int top) -> absl::Status {
    if (limits.max_logprobs == -1 || count(top) <= limits.max_logprobs) return absl::OkStatus();
    return Bad(param,
               absl::StrCat(top == -1 ? absl::StrCat("-1 (the whole vocabulary, ", vocab, " ids)")
                                      : absl::StrCat(top),
                            " is more alternatives than this server returns: at most ",
                            limits.max_logprobs, " (--max-logprobs; -1 there: no cap)"));
  };
  if (r.logprobs()) RETURN_IF_ERROR(over_max(r.chat ? "top_logprobs" : "logprobs", *r.logprobs()));
  if (r.prompt_logprobs) RETURN_IF_ERROR(over_max("prompt_logprobs", *r.prompt_logprobs));
  const int64_t prompts = std::max<int64_t>(1, static_cast<int64_t>(r.prompts.size()));
  const int64_t alternatives = std::min<int64_t>(r.alternatives(), vocab);
  if (r.logprobs()) {
    const int64_t entries = prompts * r.n() * max_tokens * (1 + alternatives);
    if (entries > limits.max_logprob_entries) {
      return Bad("logprobs",
                 absl::StrCat("prompts × n × max_tokens × (1 + alternatives) = ", prompts, " × ",
                              r.n(), " × ", max_tokens, " × ", 1 + alternatives, " = ", entries,
                              " log-probability entries; the limit is ", limits.max_logprob_entries,
                              " (--max-logprob-entries): ask for fewer tokens, choices or "
                              "alternatives"));
    }
  }
  if (std::optional<int> top = r.worker_prompt_logprobs()) {
    const int64_t entries = prompt_tokens * r.n() * (1 + count(*top));
    if (entries > limits.max_logprob_entries) {
      return Bad(r.prompt_logprobs ? "prompt_logprobs" : "echo",
                 absl::StrCat("prompt tokens × n × (1 + alternatives) = ", prompt_tokens, " × ",
                              r.n(), " × ", 1 + count(*top), " = ", entries,
                              " log-probability entries; the limit is ", limits.max_logprob_entries,
                              " (--max-logprob-entries)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace kvserve::frontend
