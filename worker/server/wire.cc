#include "worker/server/wire.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/reflection.h"
#include "google/protobuf/unknown_field_set.h"
#include "proto/constraint_wire.h"

namespace kvserve::worker {
namespace {

namespace pb = kvserve::v1;
namespace gp = google::protobuf;

// "path.number" of every field in `m` (and the messages in it) that this build's schema does
// not have.
void CollectUnknown(const gp::Message& m, const std::string& path, std::vector<std::string>& out) {
  const gp::Reflection* r = m.GetReflection();
  const gp::UnknownFieldSet& unknown = r->GetUnknownFields(m);
  for (int i = 0; i < unknown.field_count(); ++i) {
    out.push_back(absl::StrCat(path, path.empty() ? "" : ".", "#", unknown.field(i).number()));
  }
  std::vector<const gp::FieldDescriptor*> fields;
  r->ListFields(m, &fields);
  for (const gp::FieldDescriptor* f : fields) {
    if (f->cpp_type() != gp::FieldDescriptor::CPPTYPE_MESSAGE) continue;
    const std::string sub = path.empty() ? f->name() : absl::StrCat(path, ".", f->name());
    if (f->is_repeated()) {
      for (int i = 0; i < r->FieldSize(m, f); ++i) {
        CollectUnknown(r->GetRepeatedMessage(m, f, i), sub, out);
      }
    } else {
      CollectUnknown(r->GetMessage(m, f), sub, out);
    }
  }
}

// The engine's sampling parameters from the wire's (ranges are the engine's to check).
SamplingParams SamplingFromWire(const pb::SamplingParams& sp) {
  SamplingParams out;
  out.temperature = sp.temperature();
  out.top_p = sp.top_p() == 0 ? 1.0f : sp.top_p();
  out.top_k = sp.top_k();
  out.min_p = sp.min_p();
  if (sp.has_seed()) out.seed = sp.seed();
  if (sp.has_logprobs()) out.logprobs = sp.logprobs();
  if (sp.has_prompt_logprobs()) out.prompt_logprobs = sp.prompt_logprobs();
  out.ignore_eos = sp.ignore_eos();
  out.n = sp.n() == 0 ? 1 : sp.n();
  out.presence_penalty = sp.presence_penalty();
  out.frequency_penalty = sp.frequency_penalty();
  out.repetition_penalty = sp.repetition_penalty() == 0 ? 1.0f : sp.repetition_penalty();
  out.min_tokens = sp.min_tokens();
  out.logit_bias.assign(sp.logit_bias().begin(), sp.logit_bias().end());
  for (const pb::TokenIds& word : sp.bad_words()) {
    out.bad_words.emplace_back(word.ids().begin(), word.ids().end());
  }
  out.allowed_token_ids.assign(sp.allowed_token_ids().begin(), sp.allowed_token_ids().end());
  out.logprob_token_ids.assign(sp.logprob_token_ids().begin(), sp.logprob_token_ids().end());
  return out;
}

}  // namespace

absl::StatusOr<WireRequest> RequestFromWire(const pb::GenerateRequest& req) {
  std::vector<std::string> unknown;
  CollectUnknown(req, "", unknown);
  if (!unknown.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the request sets fields this worker does not know (", absl::StrJoin(unknown, ", "),
        "): it would be served without them; upgrade the worker to the router's version"));
  }
  WireRequest w;
  RequestInput& in = w.input;
  in.request_id = req.request_id();
  in.prompt.assign(req.prompt_token_ids().begin(), req.prompt_token_ids().end());
  in.max_tokens = req.max_tokens();
  in.stop_token_ids.assign(req.stop_token_ids().begin(), req.stop_token_ids().end());
  in.priority = req.priority();
  in.cache_salt = req.cache_salt();
  in.sampling = SamplingFromWire(req.sampling());
  ASSIGN_OR_RETURN(in.constraint, ConstraintFromWire(req.sampling().constraint()));
  w.stream = req.stream();
  w.predicted_cached_tokens = req.predicted_cached_tokens();
  in.predicted_cached_tokens = std::max(0, req.predicted_cached_tokens());
  w.router_id = req.router_id();
  w.placement = req.placement();
  return w;
}

void ToWire(const TokenLogprobs& lp, pb::PositionLogprobs* out) {
  out->mutable_sampled()->set_token_id(lp.token);
  out->mutable_sampled()->set_logprob(lp.logprob);
  out->set_rank(lp.rank);
  for (auto [tok, logprob] : lp.top) {
    pb::TokenLogprob* t = out->add_top();
    t->set_token_id(tok);
    t->set_logprob(logprob);
  }
}

pb::FinishReason ToWire(FinishReason r) {
  switch (r) {
    case FinishReason::kStop:
      return pb::FINISH_REASON_STOP;
    case FinishReason::kLength:
      return pb::FINISH_REASON_LENGTH;
    case FinishReason::kAbort:
      return pb::FINISH_REASON_ABORT;
    case FinishReason::kNone:
      break;
  }
  return pb::FINISH_REASON_UNSPECIFIED;
}

pb::Medium ToWire(Medium m) { return m == Medium::kHost ? pb::MEDIUM_HOST : pb::MEDIUM_DEVICE; }

void ToWire(const absl::Status& s, pb::Error* out) {
  out->set_code(static_cast<int>(s.code()));
  out->set_message(std::string(s.message()));
}

}  // namespace kvserve::worker
