#include "epp/ext_proc_exchange.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace kvserve::epp {

using frontend::MakeOpenAiError;
using frontend::OpenAiError;
namespace {

constexpr int kOverwriteIfExistsOrAdd = 2;  // envoy.config.core.v3.HeaderValueOption's action

// A header's value: raw_value, where Envoy puts it since 1.27; value before.
const std::string& ValueOf(const ext_proc::HeaderValue& h) {
  return h.raw_value().empty() ? h.value() : h.raw_value();
}

// The subset hint's endpoints: a list of strings or one comma-separated string (both are what
// gateways send, as the reference picker reads it); unset when the hint is absent.
std::optional<std::vector<std::string>> SubsetOf(const ext_proc::Metadata& metadata) {
  auto ns = metadata.filter_metadata().find(kSubsetNamespace);
  if (ns == metadata.filter_metadata().end()) return std::nullopt;
  auto key = ns->second.fields().find(kSubsetKey);
  if (key == ns->second.fields().end()) return std::nullopt;
  std::vector<std::string> out;
  auto add = [&](const std::string& text) {
    for (absl::string_view e : absl::StrSplit(text, ',')) {
      e = absl::StripAsciiWhitespace(e);
      if (!e.empty()) out.emplace_back(e);
    }
  };
  const google::protobuf::Value& v = key->second;
  if (v.has_string_value()) add(v.string_value());
  for (const google::protobuf::Value& item : v.list_value().values()) {
    if (item.has_string_value()) add(item.string_value());
  }
  return out;  // empty: no endpoint is eligible (a 503)
}

std::string ServedOf(const ext_proc::Metadata& metadata) {
  auto ns = metadata.filter_metadata().find(kDestinationNamespace);
  if (ns == metadata.filter_metadata().end()) return "";
  auto key = ns->second.fields().find(kServedKey);
  return key == ns->second.fields().end() ? "" : key->second.string_value();
}

// The answer's common part: the destination header set, the route recomputed.
void SetDestination(const std::string& endpoints, ext_proc::CommonResponse* r) {
  ext_proc::HeaderValueOption* h = r->mutable_header_mutation()->add_set_headers();
  h->mutable_header()->set_key(kDestinationKey);
  h->mutable_header()->set_raw_value(endpoints);
  h->set_append_action(kOverwriteIfExistsOrAdd);
  r->set_clear_route_cache(true);
}

void SetMetadata(const std::string& endpoints, ext_proc::ProcessingResponse* r) {
  google::protobuf::Struct inner;
  (*inner.mutable_fields())[kDestinationKey].set_string_value(endpoints);
  *(*r->mutable_dynamic_metadata()->mutable_fields())[kDestinationNamespace]
       .mutable_struct_value() = std::move(inner);
}

bool CanCarryPick(ext_proc::BodySendMode m) {
  return m == ext_proc::NONE || m == ext_proc::BUFFERED || m == ext_proc::FULL_DUPLEX_STREAMED;
}

}  // namespace

absl::Status ExtProcExchange::ReadMode(const ext_proc::ProcessingRequest& m) {
  if (mode_read_) return absl::OkStatus();
  mode_read_ = true;
  if (m.has_protocol_config()) {
    o_.request_body_mode = m.protocol_config().request_body_mode();
    o_.response_body_mode = m.protocol_config().response_body_mode();
  }
  if (!CanCarryPick(o_.request_body_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "request_body_mode ", ext_proc::BodySendMode_Name(o_.request_body_mode),
        " cannot carry an endpoint pick (the headers go upstream before the body is read): "
        "configure FULL_DUPLEX_STREAMED, as the Gateway API Inference Extension does, or "
        "BUFFERED"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ext_proc::ProcessingResponse>> ExtProcExchange::OnMessage(
    const ext_proc::ProcessingRequest& m) {
  std::vector<ext_proc::ProcessingResponse> out;
  if (m.observability_mode()) return out;  // answers would be ignored
  if (absl::Status s = ReadMode(m); !s.ok()) return s;
  switch (m.request_case()) {
    case ext_proc::ProcessingRequest::kRequestHeaders:
      OnRequestHeaders(m, out);
      break;
    case ext_proc::ProcessingRequest::kRequestBody:
      OnRequestBody(m.request_body(), out);
      break;
    case ext_proc::ProcessingRequest::kRequestTrailers:
      if (phase_ < Phase::kAsked) {  // the body ended without end_of_stream
        trailers_pending_ = true;
        Ask();
      } else {
        out.emplace_back().mutable_request_trailers();
      }
      break;
    case ext_proc::ProcessingRequest::kResponseHeaders:
    case ext_proc::ProcessingRequest::kResponseBody:
    case ext_proc::ProcessingRequest::kResponseTrailers:
      OnResponse(m, out);
      break;
    case ext_proc::ProcessingRequest::REQUEST_NOT_SET:
      return absl::InvalidArgumentError("a ProcessingRequest with none of its request fields");
  }
  return out;
}

void ExtProcExchange::OnRequestHeaders(const ext_proc::ProcessingRequest& m,
                                       std::vector<ext_proc::ProcessingResponse>& out) {
  if (phase_ != Phase::kHeaders) return;  // a second request's headers on one stream: ignored
  for (const ext_proc::HeaderValue& h : m.request_headers().headers().headers()) {
    if (h.key() == ":path") request_.path = ValueOf(h);
    if (h.key() == "x-session-id") request_.session_id = ValueOf(h);
  }
  request_.subset = SubsetOf(m.metadata_context());
  if (m.request_headers().end_of_stream() || o_.request_body_mode == ext_proc::NONE) {
    picked_on_headers_ = true;
    return Ask();
  }
  phase_ = Phase::kBody;
  // BUFFERED: Envoy sends the body only once the headers are answered.
  if (o_.request_body_mode == ext_proc::BUFFERED) out.emplace_back().mutable_request_headers();
}

void ExtProcExchange::OnRequestBody(const ext_proc::HttpBody& b,
                                    std::vector<ext_proc::ProcessingResponse>& out) {
  if (phase_ != Phase::kBody) return;
  if (request_.body.size() + b.body().size() > o_.max_body_bytes) {
    out = Refused(MakeOpenAiError(413, "invalid_request_error",
                                  absl::StrCat("the request body is over the endpoint picker's ",
                                               o_.max_body_bytes, " bytes")));
    return;
  }
  request_.body += b.body();
  // BUFFERED sends the body in one message (end_of_stream false when trailers follow).
  if (b.end_of_stream() || o_.request_body_mode == ext_proc::BUFFERED) Ask();
}

void ExtProcExchange::OnResponse(const ext_proc::ProcessingRequest& m,
                                 std::vector<ext_proc::ProcessingResponse>& out) {
  if (m.has_response_headers()) {
    response_started_ = true;
    served_ = ServedOf(m.metadata_context());
    out.emplace_back().mutable_response_headers();
    finished_ = finished_ || m.response_headers().end_of_stream();
  } else if (m.has_response_body()) {
    ext_proc::BodyResponse* r = out.emplace_back().mutable_response_body();
    if (o_.response_body_mode == ext_proc::FULL_DUPLEX_STREAMED) {  // the body goes back as is
      ext_proc::StreamedBodyResponse* s =
          r->mutable_response()->mutable_body_mutation()->mutable_streamed_response();
      s->set_body(m.response_body().body());
      s->set_end_of_stream(m.response_body().end_of_stream());
    }
    finished_ = finished_ || m.response_body().end_of_stream();
  } else {
    out.emplace_back().mutable_response_trailers();
    finished_ = true;
  }
}

void ExtProcExchange::Ask() {
  phase_ = Phase::kAsked;
  ask_ = request_;  // a copy: the body goes back to Envoy after the pick
}

std::optional<PickAsk> ExtProcExchange::TakePickAsk() { return std::exchange(ask_, std::nullopt); }

std::vector<ext_proc::ProcessingResponse> ExtProcExchange::Picked(
    const std::vector<std::string>& endpoints) {
  std::vector<ext_proc::ProcessingResponse> out;
  if (phase_ != Phase::kAsked) return out;
  phase_ = Phase::kPicked;
  const std::string value = absl::StrJoin(endpoints, ",");
  ext_proc::ProcessingResponse& first = out.emplace_back();
  SetMetadata(value, &first);
  if (o_.request_body_mode == ext_proc::BUFFERED && !picked_on_headers_) {
    SetDestination(value, first.mutable_request_body()->mutable_response());
  } else {
    SetDestination(value, first.mutable_request_headers()->mutable_response());
  }
  if (o_.request_body_mode == ext_proc::FULL_DUPLEX_STREAMED && !picked_on_headers_) {
    // The body, which Envoy did not keep, goes back in chunks; the last ends the stream unless
    // trailers follow.
    const std::string& body = request_.body;
    size_t at = 0;
    do {
      const size_t n = std::min(o_.chunk_bytes, body.size() - at);
      ext_proc::StreamedBodyResponse* s = out.emplace_back()
                                              .mutable_request_body()
                                              ->mutable_response()
                                              ->mutable_body_mutation()
                                              ->mutable_streamed_response();
      s->set_body(body.substr(at, n));
      at += n;
      s->set_end_of_stream(at == body.size() && !trailers_pending_);
    } while (at < body.size());
  }
  if (trailers_pending_) out.emplace_back().mutable_request_trailers();
  request_.body.clear();
  request_.body.shrink_to_fit();
  return out;
}

std::vector<ext_proc::ProcessingResponse> ExtProcExchange::Refused(const OpenAiError& error) {
  std::vector<ext_proc::ProcessingResponse> out;
  if (phase_ == Phase::kPicked) return out;
  phase_ = Phase::kPicked;
  finished_ = true;
  ext_proc::ImmediateResponse* r = out.emplace_back().mutable_immediate_response();
  r->mutable_status()->set_code(error.http_status);
  ext_proc::HeaderValueOption* h = r->mutable_headers()->add_set_headers();
  h->mutable_header()->set_key("content-type");
  h->mutable_header()->set_raw_value("application/json");
  h->set_append_action(kOverwriteIfExistsOrAdd);
  r->set_body(error.json);
  r->set_details(absl::StrCat("kvserve_endpoint_picker_", error.http_status));
  return out;
}

}  // namespace kvserve::epp
