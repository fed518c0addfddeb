// ExtProcExchange: the endpoint-picker protocol's answers to an ext_proc stream, message by
// message (tests/node/epp_test.mjs drives the whole picker over gRPC).
#include "epp/ext_proc_exchange.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace kvserve::epp {
namespace {

using frontend::OpenAiError;

using Responses = std::vector<ext_proc::ProcessingResponse>;

ext_proc::ProcessingRequest Headers(const std::string& path, bool eos = false) {
  ext_proc::ProcessingRequest m;
  ext_proc::HeaderValue* h = m.mutable_request_headers()->mutable_headers()->add_headers();
  h->set_key(":path");
  h->set_raw_value(path);
  m.mutable_request_headers()->set_end_of_stream(eos);
  return m;
}

ext_proc::ProcessingRequest Body(const std::string& text, bool eos) {
  ext_proc::ProcessingRequest m;
  m.mutable_request_body()->set_body(text);
  m.mutable_request_body()->set_end_of_stream(eos);
  return m;
}

Responses Send(ExtProcExchange& x, const ext_proc::ProcessingRequest& m) {
  absl::StatusOr<Responses> r = x.OnMessage(m);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : Responses{};
}

std::string Destination(const ext_proc::CommonResponse& c) {
  for (const auto& h : c.header_mutation().set_headers()) {
    if (h.header().key() == kDestinationKey) return h.header().raw_value();
  }
  return "";
}

TEST(ExtProcExchangeTest, FullDuplexAnswersTheHeadersWithThePickThenStreamsTheBodyBack) {
  ExtProcExchange x({.chunk_bytes = 64 << 10});
  EXPECT_TRUE(Send(x, Headers("/v1/completions")).empty()) << "the headers' answer waits";
  const std::string body(150 << 10, 'a');
  EXPECT_TRUE(Send(x, Body(body.substr(0, 100), false)).empty());
  EXPECT_TRUE(Send(x, Body(body.substr(100), true)).empty());
  std::optional<PickAsk> ask = x.TakePickAsk();
  ASSERT_TRUE(ask.has_value());
  EXPECT_EQ(ask->path, "/v1/completions");
  EXPECT_EQ(ask->body, body);
  EXPECT_FALSE(ask->subset.has_value());
  EXPECT_FALSE(x.TakePickAsk().has_value()) << "asked once";
  Responses out = x.Picked({"10.0.0.1:8000", "10.0.0.2:8000"});
  ASSERT_EQ(out.size(), 4u) << "headers, then 3 chunks of at most 64 KiB";
  ASSERT_TRUE(out[0].has_request_headers());
  EXPECT_EQ(Destination(out[0].request_headers().response()), "10.0.0.1:8000,10.0.0.2:8000");
  EXPECT_TRUE(out[0].request_headers().response().clear_route_cache());
  EXPECT_EQ(out[0]
                .dynamic_metadata()
                .fields()
                .at(kDestinationNamespace)
                .struct_value()
                .fields()
                .at(kDestinationKey)
                .string_value(),
            "10.0.0.1:8000,10.0.0.2:8000");
  std::string back;
  for (size_t i = 1; i < out.size(); ++i) {
    const auto& s = out[i].request_body().response().body_mutation().streamed_response();
    back += s.body();
    EXPECT_EQ(s.end_of_stream(), i + 1 == out.size());
  }
  EXPECT_EQ(back, body);
  EXPECT_TRUE(x.Refused(OpenAiError{.http_status = 503}).empty()) << "answered once";
}

TEST(ExtProcExchangeTest, BufferedAnswersTheHeadersAtOnceAndSetsTheEndpointWithTheBody) {
  ExtProcExchange x({});
  ext_proc::ProcessingRequest h = Headers("/v1/chat/completions");
  h.mutable_protocol_config()->set_request_body_mode(ext_proc::BUFFERED);
  Responses first = Send(x, h);
  ASSERT_EQ(first.size(), 1u);
  EXPECT_FALSE(first[0].request_headers().response().has_header_mutation());
  EXPECT_TRUE(Send(x, Body("{}", true)).empty());
  ASSERT_TRUE(x.TakePickAsk().has_value());
  Responses out = x.Picked({"10.0.0.1:8000"});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(Destination(out[0].request_body().response()), "10.0.0.1:8000");
}

TEST(ExtProcExchangeTest, TrailersEndABodyWithoutEndOfStreamAndAreAnsweredAfterThePick) {
  ExtProcExchange x({});
  Send(x, Headers("/v1/completions"));
  Send(x, Body("{}", false));
  ext_proc::ProcessingRequest t;
  t.mutable_request_trailers();
  EXPECT_TRUE(Send(x, t).empty());
  ASSERT_TRUE(x.TakePickAsk().has_value());
  Responses out = x.Picked({"10.0.0.1:8000"});
  ASSERT_EQ(out.size(), 3u);
  EXPECT_FALSE(
      out[1].request_body().response().body_mutation().streamed_response().end_of_stream());
  EXPECT_TRUE(out[2].has_request_trailers());
}

TEST(ExtProcExchangeTest, ABodyOverTheLimitIsA413) {
  ExtProcExchange x({.max_body_bytes = 10});
  Send(x, Headers("/v1/completions"));
  Responses out = Send(x, Body(std::string(11, 'x'), true));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].immediate_response().status().code(), 413);
  EXPECT_FALSE(x.TakePickAsk().has_value());
  EXPECT_TRUE(x.finished());
}

TEST(ExtProcExchangeTest, NoBodyIsPickedOnTheHeaders) {
  ExtProcExchange x({});
  EXPECT_TRUE(Send(x, Headers("/v1/models", /*eos=*/true)).empty());
  ASSERT_TRUE(x.TakePickAsk().has_value());
  Responses out = x.Picked({"10.0.0.1:8000"});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(Destination(out[0].request_headers().response()), "10.0.0.1:8000");
}

TEST(ExtProcExchangeTest, TheSubsetHintIsAListOrACommaString) {
  for (bool as_list : {true, false}) {
    ExtProcExchange x({});
    ext_proc::ProcessingRequest h = Headers("/v1/models", true);
    google::protobuf::Value& v =
        (*(*h.mutable_metadata_context()->mutable_filter_metadata())[kSubsetNamespace]
              .mutable_fields())[kSubsetKey];
    if (as_list) {
      v.mutable_list_value()->add_values()->set_string_value("10.0.0.1:8000");
      v.mutable_list_value()->add_values()->set_string_value(" 10.0.0.2:8000 ");
    } else {
      v.set_string_value("10.0.0.1:8000, 10.0.0.2:8000");
    }
    Send(x, h);
    std::optional<PickAsk> ask = x.TakePickAsk();
    ASSERT_TRUE(ask && ask->subset);
    EXPECT_EQ(*ask->subset, (std::vector<std::string>{"10.0.0.1:8000", "10.0.0.2:8000"}));
  }
}

TEST(ExtProcExchangeTest, TheResponseIsEchoedInFullDuplexAndEndsTheExchange) {
  ExtProcExchange x({});
  ext_proc::ProcessingRequest h = Headers("/v1/models", true);
  h.mutable_protocol_config()->set_response_body_mode(ext_proc::FULL_DUPLEX_STREAMED);
  Send(x, h);
  x.TakePickAsk();
  x.Picked({"10.0.0.1:8000"});
  ext_proc::ProcessingRequest rh;
  rh.mutable_response_headers();
  (*(*rh.mutable_metadata_context()->mutable_filter_metadata())[kDestinationNamespace]
        .mutable_fields())[kServedKey]
      .set_string_value("10.0.0.1:8000");
  EXPECT_EQ(Send(x, rh).size(), 1u);
  EXPECT_TRUE(x.response_started());
  EXPECT_EQ(x.served(), "10.0.0.1:8000");
  ext_proc::ProcessingRequest rb;
  rb.mutable_response_body()->set_body("data: [DONE]");
  rb.mutable_response_body()->set_end_of_stream(true);
  Responses out = Send(x, rb);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].response_body().response().body_mutation().streamed_response().body(),
            "data: [DONE]");
  EXPECT_TRUE(x.finished());
}

TEST(ExtProcExchangeTest, ModesThatCannotCarryAPickEndTheStreamNamingThem) {
  for (ext_proc::BodySendMode m :
       {ext_proc::STREAMED, ext_proc::BUFFERED_PARTIAL, ext_proc::GRPC}) {
    ExtProcExchange x({});
    ext_proc::ProcessingRequest h = Headers("/v1/completions");
    h.mutable_protocol_config()->set_request_body_mode(m);
    absl::StatusOr<Responses> r = x.OnMessage(h);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(r.status().message().find(ext_proc::BodySendMode_Name(m)), std::string::npos);
  }
}

TEST(ExtProcExchangeTest, ObservabilityModeIsNeverAnswered) {
  ExtProcExchange x({});
  ext_proc::ProcessingRequest h = Headers("/v1/models", true);
  h.set_observability_mode(true);
  EXPECT_TRUE(Send(x, h).empty());
  EXPECT_FALSE(x.TakePickAsk().has_value());
}

}  // namespace
}  // namespace kvserve::epp
