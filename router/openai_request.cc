#include "router/openai_request.h"

#include <algorithm>
#include <iterator>
#include <limits>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "common/string_util.h"
#include "nlohmann/json.hpp"
#include "simdjson.h"

namespace kvserve::router {
namespace {
namespace pb = kvserve::v1;

using simdjson::dom::element;
using simdjson::dom::object;

absl::Status Bad(std::string_view param, std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(Sv(param), ": ", Sv(what)));
}

std::optional<element> Field(object o, std::string_view key) {
  element e;
  if (o[key].get(e) != simdjson::SUCCESS || e.is_null()) return std::nullopt;
  return e;
}

absl::StatusOr<double> Number(object o, std::string_view key, double fallback, double lo,
                              double hi) {
  auto e = Field(o, key);
  if (!e) return fallback;
  double v;
  if (e->get_double().get(v) != simdjson::SUCCESS) {
    int64_t i;
    if (e->get_int64().get(i) != simdjson::SUCCESS) return Bad(key, "must be a number");
    v = static_cast<double>(i);
  }
  if (!(v >= lo && v <= hi))
    return Bad(key, absl::StrCat("must be in [", lo, ", ", hi, "], got ", v));
  return v;
}

absl::StatusOr<int64_t> Integer(object o, std::string_view key, int64_t fallback, int64_t lo,
                                int64_t hi) {
  auto e = Field(o, key);
  if (!e) return fallback;
  int64_t v;
  if (e->get_int64().get(v) != simdjson::SUCCESS) return Bad(key, "must be an integer");
  if (v < lo || v > hi) return Bad(key, absl::StrCat("must be in [", lo, ", ", hi, "], got ", v));
  return v;
}

absl::StatusOr<bool> Bool(object o, std::string_view key, bool fallback) {
  auto e = Field(o, key);
  if (!e) return fallback;
  bool v;
  if (e->get_bool().get(v) != simdjson::SUCCESS) return Bad(key, "must be true or false");
  return v;
}

// A nested field `key` of `o` as a bool, its errors naming `param` (its full name).
absl::StatusOr<bool> NestedBool(object o, std::string_view key, std::string_view param,
                                bool fallback) {
  auto e = Field(o, key);
  bool v = fallback;
  if (e && e->get_bool().get(v) != simdjson::SUCCESS) return Bad(param, "must be true or false");
  return v;
}

absl::StatusOr<std::string> String(object o, std::string_view key) {
  auto e = Field(o, key);
  if (!e) return std::string();
  std::string_view v;
  if (e->get_string().get(v) != simdjson::SUCCESS) return Bad(key, "must be a string");
  return std::string(v);
}

absl::Status Unserved(std::string_view param, std::string_view neutral) {
  return Bad(param, absl::StrCat("is not supported by kvserve; leave it unset", Sv(neutral)));
}

bool NonEmptyArray(object o, std::string_view key) {
  auto e = Field(o, key);
  simdjson::dom::array arr;
  return e && (e->get_array().get(arr) != simdjson::SUCCESS || arr.size() != 0);
}

// vLLM's request fields (vllm/entrypoints/openai/protocol.py) that kvserve does not serve, and
// why, each refused unless null or its neutral value: an empty list, object or string, or the
// value below. spaces_between_special_tokens is accepted either way: with the byte-level BPE
// tokenizers kvserve loads, transformers' fast tokenizers (and so vLLM) write the same text.
absl::Status RefuseVllmExtensions(object o, bool chat) {
  struct Extension {
    const char* key;
    const char* why;
  };
  static constexpr Extension kEmptyOnly[] = {
      {"documents", "kvserve's chat templates take no documents"},
      {"chat_template", "kvserve renders the model's own template family"},
      {"mm_processor_kwargs", "kvserve serves text models only"},
      {"guided_decoding_backend", "kvserve has one constraint engine of its own"},
      {"logits_processors", "kvserve loads no logits processors by name"},
      {"kv_transfer_params", "disaggregated prefill is not served yet (issue 44)"},
      {"vllm_xargs", "kvserve has no custom extensions to pass them to"},
      {"structural_tag", "structural tags are not served yet"},
      {"reasoning_effort", "use chat_template_kwargs.enable_thinking"},
      {"prompt_embeds", "kvserve takes text or token-id prompts"},
  };
  for (const Extension& e : kEmptyOnly) {
    auto f = Field(o, e.key);
    if (!f) continue;
    simdjson::dom::array arr;
    object obj;
    std::string_view str;
    const bool empty = (f->get_array().get(arr) == simdjson::SUCCESS && arr.size() == 0) ||
                       (f->get_object().get(obj) == simdjson::SUCCESS && obj.size() == 0) ||
                       (f->get_string().get(str) == simdjson::SUCCESS && str.empty());
    if (!empty) return Bad(e.key, absl::StrCat("is not supported by kvserve (", e.why, ")"));
  }
  ASSIGN_OR_RETURN(double length_penalty, Number(o, "length_penalty", 1, -1e9, 1e9));
  if (length_penalty != 1) return Unserved("length_penalty", " or 1 (it is for beam search)");
  RETURN_IF_ERROR(Bool(o, "spaces_between_special_tokens", true).status());
  if (chat) {
    ASSIGN_OR_RETURN(bool include_reasoning, Bool(o, "include_reasoning", true));
    if (!include_reasoning) return Unserved("include_reasoning", " or true");
  }
  return absl::OkStatus();
}

// Parameters of OpenAI's API, or of vLLM's extensions to it, that kvserve does not serve. Each is
// refused when it asks for something, so that no answer silently ignores it; its neutral value
// (0, 1, false, empty) passes, as clients send those by default.
absl::Status RefuseUnserved(object o, bool chat, int n) {
  RETURN_IF_ERROR(RefuseVllmExtensions(o, chat));
  ASSIGN_OR_RETURN(bool beam, Bool(o, "use_beam_search", false));
  if (beam) return Unserved("use_beam_search", " or false");
  // best_of == n asks for nothing more: every sample is returned.
  ASSIGN_OR_RETURN(int64_t best_of, Integer(o, "best_of", n, n, 128));
  if (best_of != n) {
    return Bad("best_of",
               "must equal n: kvserve returns every sample it draws (vLLM's V1 engine dropped "
               "best_of too); ask for n samples with logprobs and keep the best by their sum");
  }
  // vLLM's token-id outputs (issue 42).
  if (Field(o, "logprob_token_ids")) return Unserved("logprob_token_ids", "");
  if (chat) {
    ASSIGN_OR_RETURN(bool echo, Bool(o, "echo", false));
    if (echo) return Bad("echo", "is served on /v1/completions only; leave it unset or false");
    if (Field(o, "prompt_logprobs")) {
      return Bad("prompt_logprobs", "is served on /v1/completions only; leave it unset");
    }
    if (NonEmptyArray(o, "functions")) {
      return Bad("functions", "the legacy function calling is not served; send tools instead");
    }
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(std::string suffix, String(o, "suffix"));
  if (!suffix.empty()) return Unserved("suffix", " or \"\"");
  return absl::OkStatus();
}

absl::Status TooLong(std::string_view param, int64_t bytes, const RequestLimits& limits) {
  return Bad(param, absl::StrCat("has over ", bytes, " bytes of text; the limit is ",
                                 limits.max_prompt_bytes, " (--max-prompt-bytes)"));
}

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
    ASSIGN_OR_RETURN(bool want, Bool(o, "logprobs", false));
    if (want) {
      ASSIGN_OR_RETURN(int64_t top, Integer(o, "top_logprobs", 0, 0, 20));
      s.set_logprobs(static_cast<int32_t>(top));
    }
  } else if (Field(o, "logprobs")) {
    ASSIGN_OR_RETURN(int64_t top, Integer(o, "logprobs", 0, 0, 20));
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
  for (auto [key, value] : bias) {
    int32_t id;
    if (!absl::SimpleAtoi(Sv(key), &id) || id < 0) {
      return Bad("logit_bias", absl::StrCat("key '", Sv(key.substr(0, 32)), "' is not a token id"));
    }
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
      ASSIGN_OR_RETURN(r->enable_thinking,
                       NestedBool(ko, "enable_thinking", "chat_template_kwargs.enable_thinking",
                                  true));
    }
  }
  return absl::OkStatus();
}

// A choice list at `e` into `spec`.
absl::Status ChoiceList(element e, const std::string& param, const RequestLimits& limits,
                        structured::ConstraintSpec* spec) {
  simdjson::dom::array arr;
  if (e.get_array().get(arr) != simdjson::SUCCESS || arr.size() == 0) {
    return Bad(param, "must be a non-empty list of strings");
  }
  if (arr.size() > static_cast<size_t>(limits.max_choices)) {
    return Bad(param,
               absl::StrCat("has ", arr.size(), " choices; the limit is ", limits.max_choices));
  }
  spec->kind = structured::ConstraintSpec::Kind::kChoice;
  int64_t bytes = 0;
  for (element c : arr) {
    std::string_view text;
    if (c.get_string().get(text) != simdjson::SUCCESS) return Bad(param, "must hold strings");
    bytes += static_cast<int64_t>(text.size());
    spec->choices.emplace_back(text);
  }
  if (bytes > limits.max_constraint_bytes) {
    return Bad(param, absl::StrCat("has ", bytes, " bytes of choices; the limit is ",
                                   limits.max_constraint_bytes));
  }
  return absl::OkStatus();
}

// A JSON schema at `e` (an object, or a string holding one) into `spec`.
absl::Status SchemaText(element e, const std::string& param, const RequestLimits& limits,
                        structured::ConstraintSpec* spec) {
  std::string_view text;
  std::string schema;
  if (e.get_string().get(text) == simdjson::SUCCESS) {
    schema = std::string(text);
  } else if (e.is_object() || e.is_bool()) {
    schema = simdjson::minify(e);
  } else {
    return Bad(param, "must be a JSON schema (an object, or a string holding one)");
  }
  if (schema.size() > static_cast<size_t>(limits.max_constraint_bytes)) {
    return Bad(param, absl::StrCat("has ", schema.size(), " bytes; the limit is ",
                                   limits.max_constraint_bytes));
  }
  spec->kind = structured::ConstraintSpec::Kind::kJsonSchema;
  spec->json_schema = std::move(schema);
  return absl::OkStatus();
}

// OpenAI's response_format: text (no constraint), json_object, or json_schema {schema, strict}.
absl::Status ResponseFormat(element e, std::vector<std::pair<std::string, element>>* given) {
  object format;
  std::string_view type;
  if (e.get_object().get(format) != simdjson::SUCCESS ||
      format["type"].get(type) != simdjson::SUCCESS) {
    return Bad("response_format", "must be an object with a string \"type\"");
  }
  if (type == "text") return absl::OkStatus();
  if (type == "json_object") {
    given->emplace_back("response_format", e);
    return absl::OkStatus();
  }
  if (type != "json_schema") {
    return Bad("response_format.type", "must be \"text\", \"json_object\" or \"json_schema\"");
  }
  object js;
  if (auto j = Field(format, "json_schema"); !j || j->get_object().get(js) != simdjson::SUCCESS) {
    return Bad("response_format.json_schema", "must be an object with a \"schema\"");
  }
  auto schema = Field(js, "schema");
  if (!schema) return Bad("response_format.json_schema.schema", "is required");
  // strict (true or false) is accepted: the output always keeps to the schema.
  if (auto strict = Field(js, "strict"); strict && !strict->is_bool() && !strict->is_null()) {
    return Bad("response_format.json_schema.strict", "must be a boolean");
  }
  given->emplace_back("response_format.json_schema.schema", *schema);
  return absl::OkStatus();
}

// A regex or a GBNF grammar at `e` into `spec`, as `kind`.
absl::Status ConstraintText(element e, const std::string& param, const RequestLimits& limits,
                            structured::ConstraintSpec::Kind kind,
                            structured::ConstraintSpec* spec) {
  std::string_view text;
  if (e.get_string().get(text) != simdjson::SUCCESS) return Bad(param, "must be a string");
  if (text.size() > static_cast<size_t>(limits.max_constraint_bytes)) {
    return Bad(param, absl::StrCat("has ", text.size(), " bytes; the limit is ",
                                   limits.max_constraint_bytes));
  }
  spec->kind = kind;
  (kind == structured::ConstraintSpec::Kind::kRegex ? spec->regex : spec->grammar) = text;
  return absl::OkStatus();
}

// Whether `spec` compiles (a 400 naming `param` if not). The sources that compiled lately are
// remembered (at most 256, forgotten all at once when full), so that requests sending the same
// schema do not each pay its compile (tens of ms) on the handler threads.
absl::Status CheckCompiles(const structured::ConstraintSpec& spec, const std::string& param) {
  static absl::Mutex mu(absl::kConstInit);
  static auto* compiled ABSL_GUARDED_BY(mu) = new absl::flat_hash_set<std::string>();
  const std::string key = spec.Key();
  {
    absl::MutexLock lock(&mu);
    if (compiled->contains(key)) return absl::OkStatus();
  }
  if (auto grammar = structured::CompileConstraint(spec); !grammar.ok()) {
    // (A pattern past the automaton's limits is the request's fault too: a 400.)
    return absl::InvalidArgumentError(absl::StrCat(param, ": ", grammar.status().message()));
  }
  absl::MutexLock lock(&mu);
  if (compiled->size() >= 256) compiled->clear();
  compiled->insert(key);
  return absl::OkStatus();
}

// structured_outputs' keys besides the constraint (vLLM's StructuredOutputsParams): every key
// is known or refused by name. disable_any_whitespace picks compact JSON (true) or any
// whitespace (false) over the server's default; disable_fallback asks nothing of kvserve (it
// has one engine, never a fallback); whitespace_pattern and disable_additional_properties are
// refused unless neutral, structural_tag always.
absl::Status StructuredOutputsOptions(object so, bool* any_whitespace) {
  static constexpr std::string_view kKnown[] = {"json",
                                                "json_object",
                                                "regex",
                                                "choice",
                                                "grammar",
                                                "disable_any_whitespace",
                                                "disable_fallback",
                                                "whitespace_pattern",
                                                "disable_additional_properties"};
  for (auto [key, value] : so) {
    if (key == "structural_tag" && !value.is_null()) {
      return Bad("structured_outputs.structural_tag",
                 "is not supported by kvserve yet (json, json_object, regex, choice and grammar "
                 "are)");
    }
    if (key != "structural_tag" &&
        std::find(std::begin(kKnown), std::end(kKnown), key) == std::end(kKnown)) {
      return Bad(absl::StrCat("structured_outputs.", Sv(key.substr(0, 64))),
                 "is not a structured_outputs field kvserve serves");
    }
  }
  ASSIGN_OR_RETURN(bool compact, NestedBool(so, "disable_any_whitespace",
                                             "structured_outputs.disable_any_whitespace",
                                             !*any_whitespace));
  *any_whitespace = !compact;
  RETURN_IF_ERROR(
      NestedBool(so, "disable_fallback", "structured_outputs.disable_fallback", false).status());
  ASSIGN_OR_RETURN(bool closed, NestedBool(so, "disable_additional_properties",
                                           "structured_outputs.disable_additional_properties",
                                           false));
  if (Field(so, "whitespace_pattern")) {
    return Unserved("structured_outputs.whitespace_pattern", " (use disable_any_whitespace)");
  }
  if (closed) return Unserved("structured_outputs.disable_additional_properties", " or false");
  return absl::OkStatus();
}

// The constraint of structured outputs: vLLM's guided_json / guided_regex / guided_choice /
// guided_grammar, structured_outputs {json | json_object | regex | choice | grammar}, or OpenAI's
// response_format; at most one; compiled here so that a bad one is a 400.
absl::Status ParseConstraint(object o, const RequestLimits& limits, ParsedRequest* r) {
  if (Field(o, "guided_whitespace_pattern")) {
    return Unserved("guided_whitespace_pattern",
                    " (JSON is compact, or any whitespace with "
                    "structured_outputs.disable_any_whitespace false)");
  }
  bool any_whitespace = limits.json_any_whitespace;
  std::vector<std::pair<std::string, element>> given;
  for (const char* key : {"guided_json", "guided_regex", "guided_choice", "guided_grammar"}) {
    if (auto e = Field(o, key)) given.emplace_back(key, *e);
  }
  if (auto e = Field(o, "response_format")) RETURN_IF_ERROR(ResponseFormat(*e, &given));
  if (auto e = Field(o, "structured_outputs")) {
    object so;
    if (e->get_object().get(so) != simdjson::SUCCESS) {
      return Bad("structured_outputs", "must be an object");
    }
    RETURN_IF_ERROR(StructuredOutputsOptions(so, &any_whitespace));
    if (auto f = Field(so, "json_object")) {
      if (!f->is_bool()) return Bad("structured_outputs.json_object", "must be a boolean");
      if (f->get_bool().value()) given.emplace_back("structured_outputs.json_object", *f);
    }
    for (const char* key : {"json", "regex", "choice", "grammar"}) {
      if (auto f = Field(so, key)) given.emplace_back(absl::StrCat("structured_outputs.", key), *f);
    }
  }
  if (given.empty()) return absl::OkStatus();
  if (given.size() > 1) {
    return Bad(given[1].first,
               absl::StrCat("only one constraint may be given; ", given[0].first, " is too"));
  }
  const auto& [param, e] = given[0];
  structured::ConstraintSpec spec;
  if (absl::EndsWith(param, "choice")) {
    RETURN_IF_ERROR(ChoiceList(e, param, limits, &spec));
  } else if (absl::EndsWith(param, "regex")) {
    RETURN_IF_ERROR(
        ConstraintText(e, param, limits, structured::ConstraintSpec::Kind::kRegex, &spec));
  } else if (absl::EndsWith(param, "grammar")) {
    RETURN_IF_ERROR(
        ConstraintText(e, param, limits, structured::ConstraintSpec::Kind::kGrammar, &spec));
  } else if (param == "response_format" || absl::EndsWith(param, "json_object")) {
    spec.kind = structured::ConstraintSpec::Kind::kJsonObject;
  } else {
    RETURN_IF_ERROR(SchemaText(e, param, limits, &spec));
  }
  if (spec.kind == structured::ConstraintSpec::Kind::kJsonSchema ||
      spec.kind == structured::ConstraintSpec::Kind::kJsonObject) {
    spec.any_whitespace = any_whitespace;
  }
  RETURN_IF_ERROR(CheckCompiles(spec, param));
  r->constraint = std::move(spec);
  return absl::OkStatus();
}

bool IsToolName(std::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(c) && c != '_' && c != '-') return false;
  }
  return true;
}

// One entry of `tools`: {"type": "function", "function": {"name", "description",
// "parameters"}}.
absl::StatusOr<ToolSpec> ParseTool(element t, const std::string& param) {
  object to, fo;
  if (t.get_object().get(to) != simdjson::SUCCESS) return Bad(param, "must be an object");
  ASSIGN_OR_RETURN(std::string type, String(to, "type"));
  if (type != "function") return Bad(param + ".type", "must be \"function\"");
  if (auto f = Field(to, "function"); !f || f->get_object().get(fo) != simdjson::SUCCESS) {
    return Bad(param + ".function", "must be an object with a \"name\"");
  }
  ToolSpec tool;
  ASSIGN_OR_RETURN(tool.name, String(fo, "name"));
  if (!IsToolName(tool.name)) {
    return Bad(param + ".function.name", "must be 1 to 64 letters, digits, underscores or dashes");
  }
  if (auto p = Field(fo, "parameters")) {
    if (!p->is_object()) return Bad(param + ".function.parameters", "must be a JSON schema object");
    // A function's arguments are a JSON object (OpenAI refuses any other type; no type is
    // held to "object" when the call is constrained, tool_calls.h).
    object po;
    std::string_view type;
    auto given = p->get_object().get(po) == simdjson::SUCCESS ? Field(po, "type") : std::nullopt;
    if (given && (given->get_string().get(type) != simdjson::SUCCESS || type != "object")) {
      return Bad(param + ".function.parameters.type",
                 absl::StrCat("must be \"object\" (a function's arguments are a JSON object), not ",
                              Sv(simdjson::minify(*given).substr(0, 64))));
    }
    tool.parameters = simdjson::minify(*p);
  }
  tool.definition = simdjson::minify(t);
  return tool;
}

// tool_choice: "none" | "auto" | "required" | {"type": "function", "function": {"name"}}.
absl::Status ParseToolChoice(object o, ToolRequest* t) {
  auto e = Field(o, "tool_choice");
  t->choice = t->tools.empty() ? ToolChoice::kNone : ToolChoice::kAuto;
  if (!e) return absl::OkStatus();
  std::string_view text;
  object co, fo;
  if (e->get_string().get(text) == simdjson::SUCCESS) {
    if (text == "none")
      t->choice = ToolChoice::kNone;
    else if (text == "required")
      t->choice = ToolChoice::kRequired;
    else if (text == "auto")
      t->choice = ToolChoice::kAuto;
    else
      return Bad("tool_choice", "must be none, auto, required or a function");
  } else if (e->get_object().get(co) == simdjson::SUCCESS &&
             co["function"].get(fo) == simdjson::SUCCESS &&
             fo["name"].get(text) == simdjson::SUCCESS) {
    t->choice = ToolChoice::kNamed;
    t->name = std::string(text);
    const bool known = std::any_of(t->tools.begin(), t->tools.end(),
                                   [&](const ToolSpec& s) { return s.name == t->name; });
    if (!known) {
      return Bad("tool_choice", absl::StrCat("names '", Sv(text.substr(0, 64)),
                                             "', which is not one of the tools"));
    }
  } else {
    return Bad("tool_choice",
               "must be none, auto, required or {\"type\": \"function\", \"function\": "
               "{\"name\": ...}}");
  }
  if (t->tools.empty() && t->choice != ToolChoice::kNone) {
    return Bad("tool_choice", "needs tools: give tools, or leave tool_choice unset or \"none\"");
  }
  return absl::OkStatus();
}

// The constraint of tool_choice "required" or a named function: each tool's parameters are
// compiled alone first, so that a bad one is a 400 naming it.
absl::Status ToolConstraint(const RequestLimits& limits, ParsedRequest* r) {
  const ToolRequest& t = r->tool_use;
  if (t.choice != ToolChoice::kRequired && t.choice != ToolChoice::kNamed) return absl::OkStatus();
  if (r->constraint) {
    return Bad("tool_choice",
               "\"required\" and a named function constrain the output themselves; leave "
               "response_format and structured outputs unset");
  }
  for (size_t i = 0; i < t.tools.size(); ++i) {
    if (t.tools[i].parameters.empty() ||
        (t.choice == ToolChoice::kNamed && t.tools[i].name != t.name)) {
      continue;
    }
    structured::ConstraintSpec one{.kind = structured::ConstraintSpec::Kind::kJsonSchema,
                                   .json_schema = t.tools[i].parameters};
    RETURN_IF_ERROR(CheckCompiles(one, absl::StrCat("tools[", i, "].function.parameters")));
  }
  structured::ConstraintSpec spec{.kind = structured::ConstraintSpec::Kind::kJsonSchema,
                                  .any_whitespace = limits.json_any_whitespace};
  ASSIGN_OR_RETURN(spec.json_schema, ToolChoiceSchema(t));
  if (spec.json_schema.size() > static_cast<size_t>(limits.max_constraint_bytes)) {
    return Bad("tools", absl::StrCat("the schema of tool_choice has ", spec.json_schema.size(),
                                     " bytes; the limit is ", limits.max_constraint_bytes));
  }
  RETURN_IF_ERROR(CheckCompiles(spec, "tools"));
  r->constraint = std::move(spec);
  return absl::OkStatus();
}

// Chat's tools, tool_choice and parallel_tool_calls.
absl::Status ParseTools(object o, const RequestLimits& limits, ParsedRequest* r) {
  ToolRequest& t = r->tool_use;
  if (auto e = Field(o, "tools")) {
    simdjson::dom::array arr;
    if (e->get_array().get(arr) != simdjson::SUCCESS) return Bad("tools", "must be a list");
    if (arr.size() == 0) {
      return Bad("tools",
                 "must not be an empty list (as in OpenAI's API and vLLM): give a tool "
                 "or leave tools out");
    }
    if (arr.size() > static_cast<size_t>(limits.max_tools)) {
      return Bad("tools",
                 absl::StrCat("has ", arr.size(), " tools; the limit is ", limits.max_tools));
    }
    int64_t bytes = 0;
    size_t i = 0;
    for (element e : arr) {
      const std::string param = absl::StrCat("tools[", i++, "]");
      ASSIGN_OR_RETURN(ToolSpec tool, ParseTool(e, param));
      for (const ToolSpec& other : t.tools) {
        if (other.name == tool.name) return Bad(param + ".function.name", "names two tools");
      }
      bytes += static_cast<int64_t>(tool.definition.size());
      if (bytes > limits.max_prompt_bytes) return TooLong("tools", bytes, limits);
      t.tools.push_back(std::move(tool));
    }
  }
  RETURN_IF_ERROR(ParseToolChoice(o, &t));
  ASSIGN_OR_RETURN(t.parallel, Bool(o, "parallel_tool_calls", true));
  return ToolConstraint(limits, r);
}

// Completions' echo and vLLM's prompt_logprobs.
absl::Status ParseEcho(object o, ParsedRequest* r) {
  ASSIGN_OR_RETURN(r->echo, Bool(o, "echo", false));
  if (Field(o, "prompt_logprobs")) {
    ASSIGN_OR_RETURN(int64_t top, Integer(o, "prompt_logprobs", 0, 0, 20));
    r->prompt_logprobs = static_cast<int>(top);
  }
  return absl::OkStatus();
}

// stream_options: include_usage, and continuous_usage_stats (vLLM's: usage in every chunk;
// include_usage then defaults to true, as in vLLM, and false with it is a 400 rather than
// ignored); any other key is refused by name. Only with stream: true (vLLM refuses it
// otherwise).
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
  ASSIGN_OR_RETURN(bool include, NestedBool(soo, "include_usage", "stream_options.include_usage",
                                             continuous));
  if (continuous && !include) {
    return Bad("stream_options.continuous_usage_stats",
               "needs include_usage true (vLLM would ignore it)");
  }
  r->include_usage = include;
  r->continuous_usage = continuous;
  return absl::OkStatus();
}

// Streaming, output and routing options: stream, stream_options, ignore_eos, user, cache_salt,
// truncate_prompt_tokens, skip_special_tokens, include_stop_str_in_output, priority.
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
  if (!chat) RETURN_IF_ERROR(ParseEcho(o, &r));
  const char* max_key =
      chat && Field(o, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  r.max_tokens_given = Field(o, max_key).has_value();
  // max_tokens 0 with echo scores the prompt and generates nothing (vLLM's rule).
  ASSIGN_OR_RETURN(int64_t max_tokens, Integer(o, max_key, 16, r.echo ? 0 : 1, INT32_MAX));
  r.max_tokens = static_cast<int>(max_tokens);
  RETURN_IF_ERROR(ParseSampling(o, chat, &r));
  RETURN_IF_ERROR(ParseStops(o, limits, &r));
  RETURN_IF_ERROR(ParseOptions(o, limits, &r));
  RETURN_IF_ERROR(ParseAdjustments(o, limits, &r));
  if (r.sampling.min_tokens() > r.max_tokens && r.max_tokens_given) {
    return Bad("min_tokens", absl::StrCat("must be at most ", max_key, " (", r.max_tokens,
                                          "), got ", r.sampling.min_tokens()));
  }
  RETURN_IF_ERROR(RefuseUnserved(o, chat, r.n()));
  RETURN_IF_ERROR(ParseConstraint(o, limits, &r));
  if (chat) RETURN_IF_ERROR(ParseTools(o, limits, &r));
  if (r.prompt_logprobs && r.stream) {
    return Bad("prompt_logprobs", "is not served with stream: true (as in vLLM); use echo");
  }
  return r;
}

absl::Status CheckLogprobBudget(const ParsedRequest& r, int64_t max_tokens,
                                const RequestLimits& limits, int64_t prompt_tokens) {
  const int64_t prompts = std::max<int64_t>(1, static_cast<int64_t>(r.prompts.size()));
  if (r.logprobs()) {
    const int64_t entries = prompts * r.n() * max_tokens * (1 + *r.logprobs());
    if (entries > limits.max_logprob_entries) {
      return Bad("logprobs",
                 absl::StrCat("prompts × n × max_tokens × (1 + alternatives) = ", prompts, " × ",
                              r.n(), " × ", max_tokens, " × ", 1 + *r.logprobs(), " = ", entries,
                              " log-probability entries; the limit is ", limits.max_logprob_entries,
                              " (--max-logprob-entries): ask for fewer tokens, choices or "
                              "alternatives"));
    }
  }
  if (std::optional<int> top = r.worker_prompt_logprobs()) {
    const int64_t entries = prompt_tokens * r.n() * (1 + *top);
    if (entries > limits.max_logprob_entries) {
      return Bad(
          r.prompt_logprobs ? "prompt_logprobs" : "echo",
          absl::StrCat("prompt tokens × n × (1 + alternatives) = ", prompt_tokens, " × ", r.n(),
                       " × ", 1 + *top, " = ", entries, " log-probability entries; the limit is ",
                       limits.max_logprob_entries, " (--max-logprob-entries)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace kvserve::router
