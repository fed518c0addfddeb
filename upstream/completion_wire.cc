// GenerateRequest → /v1/completions, and its event stream → GenerateResponse deltas
// (completion_wire.h).
#include "upstream/completion_wire.h"

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/string_util.h"
#include "nlohmann/json.hpp"

namespace kvserve::upstream {
namespace {

namespace pb = kvserve::v1;
using json = nlohmann::json;

absl::Status Unserved(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(
      what, " is not served through an OpenAI upstream (it cannot be asked by token ids)"));
}

// "token_id:123" (return_tokens_as_token_ids) → 123.
std::optional<int32_t> TokenIdOf(const std::string& s) {
  int32_t id = 0;
  absl::string_view v(s);
  if (!absl::ConsumePrefix(&v, "token_id:") || !absl::SimpleAtoi(v, &id)) return std::nullopt;
  return id;
}

absl::StatusCode CodeOf(int http_status) {
  switch (http_status) {
    case 400:
    case 422:
      return absl::StatusCode::kInvalidArgument;
    case 401:
    case 403:
      return absl::StatusCode::kPermissionDenied;
    case 404:
      return absl::StatusCode::kNotFound;
    case 429:
      return absl::StatusCode::kResourceExhausted;
    case 501:
      return absl::StatusCode::kUnimplemented;
    default:
      return http_status >= 500 ? absl::StatusCode::kUnavailable : absl::StatusCode::kInternal;
  }
}

}  // namespace

absl::StatusOr<std::string> UpstreamCompletionBody(const pb::GenerateRequest& r,
                                                   const std::string& model) {
  const pb::SamplingParams& s = r.sampling();
  if (s.bad_words_size() > 0) return Unserved("bad_words");
  if (s.constraint().kind_case() != pb::Constraint::KIND_NOT_SET) {
    return Unserved("structured outputs (a constraint)");
  }
  if (s.has_prompt_logprobs()) return Unserved("prompt_logprobs");
  if (s.logprob_token_ids_size() > 0) return Unserved("logprob_token_ids");
  if (s.has_logprobs() && s.logprobs() < 0) {
    return absl::InvalidArgumentError(
        "top_logprobs -1 (the whole vocabulary) is not served through an OpenAI upstream (its "
        "completions API takes a count)");
  }
  json b = {{"model", model},
            {"prompt",
             json(std::vector<int32_t>(r.prompt_token_ids().begin(), r.prompt_token_ids().end()))},
            {"max_tokens", r.max_tokens()},
            {"temperature", s.temperature()},
            {"stream", true},
            {"stream_options", {{"include_usage", true}}},
            {"return_token_ids", true},
            {"return_tokens_as_token_ids", true}};
  if (s.top_p() > 0 && s.top_p() < 1) b["top_p"] = s.top_p();
  if (s.top_k() > 0) b["top_k"] = s.top_k();
  if (s.min_p() > 0) b["min_p"] = s.min_p();
  if (s.has_seed()) b["seed"] = s.seed();
  if (s.has_logprobs()) b["logprobs"] = s.logprobs();
  if (s.ignore_eos()) b["ignore_eos"] = true;
  if (s.n() > 1) b["n"] = s.n();
  if (s.presence_penalty() != 0) b["presence_penalty"] = s.presence_penalty();
  if (s.frequency_penalty() != 0) b["frequency_penalty"] = s.frequency_penalty();
  if (s.repetition_penalty() != 0 && s.repetition_penalty() != 1) {
    b["repetition_penalty"] = s.repetition_penalty();
  }
  if (s.min_tokens() > 0) b["min_tokens"] = s.min_tokens();
  if (!s.logit_bias().empty()) {
    json bias = json::object();
    for (const auto& [id, v] : s.logit_bias()) bias[std::to_string(id)] = v;
    b["logit_bias"] = bias;
  }
  if (s.allowed_token_ids_size() > 0) {
    b["allowed_token_ids"] =
        std::vector<int32_t>(s.allowed_token_ids().begin(), s.allowed_token_ids().end());
  }
  if (r.stop_token_ids_size() > 0) {
    b["stop_token_ids"] =
        std::vector<int32_t>(r.stop_token_ids().begin(), r.stop_token_ids().end());
  }
  if (r.priority() != 0) b["priority"] = r.priority();
  if (!r.cache_salt().empty()) b["cache_salt"] = r.cache_salt();
  return b.dump();
}

UpstreamStreamReader::UpstreamStreamReader(const pb::GenerateRequest& r)
    : request_id_(r.request_id()),
      n_(std::max(1, r.sampling().n())),
      prompt_tokens_(r.prompt_token_ids_size()),
      want_logprobs_(r.sampling().has_logprobs()),
      top_logprobs_(r.sampling().logprobs()),
      sample_done_(n_, false),
      last_token_(n_, -1) {}

absl::Status UpstreamStreamReader::Feed(std::string_view bytes,
                                        std::vector<pb::GenerateResponse>* out) {
  pending_.append(bytes);
  for (;;) {
    size_t end = pending_.find("\n\n");
    size_t skip = 2;
    if (const size_t crlf = pending_.find("\r\n\r\n"); crlf < end) end = crlf, skip = 4;
    if (end == std::string::npos) return absl::OkStatus();
    const std::string event = pending_.substr(0, end);
    pending_.erase(0, end + skip);
    // An event's data lines, joined (the completions stream sends one per event).
    std::string data;
    for (size_t at = 0; at < event.size();) {
      size_t nl = event.find('\n', at);
      if (nl == std::string::npos) nl = event.size();
      absl::string_view line(event.data() + at, nl - at);
      line = absl::StripTrailingAsciiWhitespace(line);
      if (absl::ConsumePrefix(&line, "data:")) {
        absl::StrAppend(&data, data.empty() ? "" : "\n", absl::StripLeadingAsciiWhitespace(line));
      }
      at = nl + 1;
    }
    if (data.empty()) continue;  // a comment or keep-alive
    if (data == "[DONE]") return Finish(out);
    if (absl::Status s = Event(data, out); !s.ok()) return s;
  }
}

absl::Status UpstreamStreamReader::Event(std::string_view data,
                                         std::vector<pb::GenerateResponse>* out) {
  const json e = json::parse(data, nullptr, /*allow_exceptions=*/false);
  if (!e.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("upstream event is not JSON: '", Sv(data.substr(0, 120)), "'"));
  }
  if (e.contains("error")) {
    const json& err = e["error"];
    const int code = err.is_object() && err.value("code", json()).is_number_integer()
                         ? err["code"].get<int>()
                         : 500;
    out->push_back(UpstreamRefusal(request_id_, code, data));
    finished_ = true;
    return absl::OkStatus();
  }
  if (e.contains("usage") && e["usage"].is_object()) {
    const json& u = e["usage"];
    pb::Usage usage;
    usage.set_prompt_tokens(u.value("prompt_tokens", prompt_tokens_));
    usage.set_completion_tokens(u.value("completion_tokens", completion_tokens_));
    if (u.contains("prompt_tokens_details") && u["prompt_tokens_details"].is_object()) {
      const json& cached = u["prompt_tokens_details"].value("cached_tokens", json());
      if (cached.is_number_integer()) usage.set_cached_prompt_tokens(cached.get<int>());
    }
    usage_ = usage;
  }
  if (!e.contains("choices") || !e["choices"].is_array()) {
    return absl::InvalidArgumentError("upstream event has no choices list");
  }
  for (const json& c : e["choices"]) {
    if (absl::Status s = Choice(&c, out); !s.ok()) return s;
  }
  if (usage_ && held_) Release(out);
  return absl::OkStatus();
}

absl::Status UpstreamStreamReader::Choice(const void* choice_json,
                                          std::vector<pb::GenerateResponse>* out) {
  const json& c = *static_cast<const json*>(choice_json);
  const int index = c.value("index", -1);
  if (index < 0 || index >= n_ || sample_done_[index]) {
    return absl::InvalidArgumentError(absl::StrCat("upstream choice index ", index, " of n ", n_));
  }
  if (!c.contains("token_ids") || !c["token_ids"].is_array()) {
    return absl::InvalidArgumentError(
        "the upstream returned no token_ids: it must honour return_token_ids (vLLM 0.10.2 on)");
  }
  pb::GenerateResponse d;
  d.set_request_id(request_id_);
  d.set_sample_index(index);
  for (const json& t : c["token_ids"]) {
    if (!t.is_number_integer()) return absl::InvalidArgumentError("upstream token id not an int");
    d.add_token_ids(t.get<int32_t>());
    last_token_[index] = t.get<int32_t>();
  }
  completion_tokens_ += d.token_ids_size();
  const json* lp = c.contains("logprobs") && c["logprobs"].is_object() ? &c["logprobs"] : nullptr;
  if (want_logprobs_ && lp != nullptr) {
    const json& sampled = lp->value("token_logprobs", json::array());
    const json& tops = lp->value("top_logprobs", json::array());
    for (int i = 0; i < d.token_ids_size(); ++i) {
      pb::PositionLogprobs* p = d.add_logprobs();
      p->mutable_sampled()->set_token_id(d.token_ids(i));
      if (i < static_cast<int>(sampled.size()) && sampled[i].is_number()) {
        p->mutable_sampled()->set_logprob(sampled[i].get<float>());
      }
      std::vector<std::pair<float, int32_t>> top;
      if (i < static_cast<int>(tops.size()) && tops[i].is_object()) {
        for (const auto& [k, v] : tops[i].items()) {
          const std::optional<int32_t> id = TokenIdOf(k);
          if (id && v.is_number()) top.emplace_back(v.get<float>(), *id);
        }
      }
      std::sort(top.begin(), top.end(), [](auto& a, auto& b) { return a.first > b.first; });
      int rank = static_cast<int>(top.size()) + 1;
      for (size_t j = 0; j < top.size(); ++j) {
        if (top[j].second == d.token_ids(i)) rank = std::min(rank, static_cast<int>(j) + 1);
        if (static_cast<int>(j) >= top_logprobs_) continue;
        pb::TokenLogprob* t = p->add_top();
        t->set_token_id(top[j].second);
        t->set_logprob(top[j].first);
      }
      p->set_rank(rank);
    }
  }
  const json& reason = c.value("finish_reason", json());
  if (reason.is_string()) {
    const std::string r = reason.get<std::string>();
    d.set_finish_reason(r == "length"  ? pb::FINISH_REASON_LENGTH
                        : r == "abort" ? pb::FINISH_REASON_ABORT
                                       : pb::FINISH_REASON_STOP);
    if (r == "stop") {
      const json& stop = c.value("stop_reason", json());
      if (stop.is_number_integer()) {
        d.set_stop_token_id(stop.get<int32_t>());
      } else if (stop.is_null() && last_token_[index] >= 0) {
        d.set_stop_token_id(last_token_[index]);  // EOS: the last id vLLM returned
      }
    }
    sample_done_[index] = true;
    if (std::all_of(sample_done_.begin(), sample_done_.end(), [](bool b) { return b; })) {
      held_ = std::move(d);  // the request's last delta waits for the usage
      return absl::OkStatus();
    }
  }
  if (d.token_ids_size() > 0 || d.finish_reason() != pb::FINISH_REASON_UNSPECIFIED) {
    out->push_back(std::move(d));
  }
  return absl::OkStatus();
}

void UpstreamStreamReader::Release(std::vector<pb::GenerateResponse>* out) {
  pb::Usage u = usage_.value_or(pb::Usage());
  if (!usage_) {
    u.set_prompt_tokens(prompt_tokens_);
    u.set_completion_tokens(completion_tokens_);
  }
  *held_->mutable_usage() = u;
  out->push_back(std::move(*held_));
  held_.reset();
  finished_ = true;
}

absl::Status UpstreamStreamReader::Finish(std::vector<pb::GenerateResponse>* out) {
  if (finished_) return absl::OkStatus();
  if (held_) {
    Release(out);
    return absl::OkStatus();
  }
  return absl::UnavailableError("the upstream's stream ended before every sample finished");
}

pb::GenerateResponse UpstreamRefusal(const std::string& request_id, int http_status,
                                     std::string_view body) {
  pb::GenerateResponse d;
  d.set_request_id(request_id);
  d.set_finish_reason(pb::FINISH_REASON_ERROR);
  std::string message(body.substr(0, 300));
  const json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_object() && j.contains("error")) {
    const json& e = j["error"];
    if (e.is_object() && e.value("message", json()).is_string()) {
      message = e["message"].get<std::string>();
    } else if (e.is_string()) {
      message = e.get<std::string>();
    }
  }
  d.mutable_error()->set_code(static_cast<int>(CodeOf(http_status)));
  d.mutable_error()->set_message(absl::StrCat("upstream answered ", http_status, ": ", message));
  return d;
}

}  // namespace kvserve::upstream
