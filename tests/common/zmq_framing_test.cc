#include "common/net/zmq_framing.h"

#include "gtest/gtest.h"
#include "kvserve/v1/kvserve.pb.h"
#include "tests/testing/status_matchers.h"

namespace kvserve {
namespace {

using ::kvserve::testing::StatusIs;
using ::testing::HasSubstr;

class ZmqFramingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    router_.bind("inproc://framing");
    dealer_.set(zmq::sockopt::routing_id, "client-1");
    dealer_.connect("inproc://framing");
  }
  zmq::context_t ctx_;
  zmq::socket_t router_{ctx_, zmq::socket_type::router};
  zmq::socket_t dealer_{ctx_, zmq::socket_type::dealer};
};

TEST_F(ZmqFramingTest, RoundTripsAMessageWithRoutingId) {
  kvserve::v1::GenerateRequest request;
  request.set_request_id("r1");
  request.add_prompt_token_ids(5);
  request.set_max_tokens(3);
  ASSERT_OK(SendMessage(dealer_, "", request));
  ASSERT_OK_AND_ASSIGN(std::optional<ReceivedMessage> m, ReceiveMessage(router_, true));
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->prefix, "client-1");
  EXPECT_EQ(m->type, "GenerateRequest");
  kvserve::v1::GenerateRequest parsed;
  ASSERT_OK(ParseMessage(*m, &parsed));
  EXPECT_EQ(parsed.request_id(), "r1");
  EXPECT_EQ(parsed.max_tokens(), 3);

  kvserve::v1::GenerateResponse response;
  response.set_request_id("r1");
  response.add_token_ids(42);
  ASSERT_OK(SendMessage(router_, m->prefix, response));
  ASSERT_OK_AND_ASSIGN(std::optional<ReceivedMessage> back, ReceiveMessage(dealer_, false));
  kvserve::v1::GenerateResponse parsed_response;
  ASSERT_OK(ParseMessage(*back, &parsed_response));
  EXPECT_EQ(parsed_response.token_ids(0), 42);
}

TEST_F(ZmqFramingTest, MalformedMessagesAreErrorsNotCrashes) {
  std::string_view one[] = {"only-one-frame"};
  ASSERT_OK(SendFrames(dealer_, one));
  EXPECT_THAT(ReceiveMessage(router_, true),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("2 frames, expected 3")));
  std::string_view garbage[] = {"GenerateRequest", "\xff\xff\xff\xff garbage"};
  ASSERT_OK(SendFrames(dealer_, garbage));
  ASSERT_OK_AND_ASSIGN(std::optional<ReceivedMessage> m, ReceiveMessage(router_, true));
  kvserve::v1::GenerateRequest request;
  EXPECT_THAT(ParseMessage(*m, &request),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("malformed GenerateRequest")));
  kvserve::v1::AbortRequest abort;
  EXPECT_THAT(ParseMessage(*m, &abort),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("is not AbortRequest")));
}

TEST_F(ZmqFramingTest, NonBlockingReceiveOnEmptySocket) {
  ASSERT_OK_AND_ASSIGN(std::optional<ReceivedMessage> m,
                       ReceiveMessage(router_, true, zmq::recv_flags::dontwait));
  EXPECT_FALSE(m.has_value());
}

}  // namespace
}  // namespace kvserve
