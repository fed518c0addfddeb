#include "common/net/frame_link.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "kvserve/v1/kvserve.pb.h"
#include "tests/testing/net.h"
#include "tests/testing/status_matchers.h"

namespace kvserve {
namespace {

using ::kvserve::testing::StatusIs;
using ::testing::HasSubstr;

// A listening socket on a free loopback port.
class Listener {
 public:
  Listener() : fd_(kvserve::testing::ListenLoopback(&port_)) { EXPECT_GE(fd_, 0); }
  ~Listener() { close(fd_); }
  int Accept() const { return accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC); }
  [[nodiscard]] int port() const { return port_; }

 private:
  int port_ = 0;
  int fd_ = -1;
};

// Flushes `writer` and reads `reader` until `reader` has handed out `count` messages (or a
// second passes, or a call fails).
absl::Status Pump(FrameLink& writer, FrameLink& reader, std::vector<ReceivedMessage>& got,
                  size_t count) {
  for (int i = 0; i < 1000 && got.size() < count; ++i) {
    RETURN_IF_ERROR(writer.Flush());
    pollfd p{reader.fd(), POLLIN, 0};
    poll(&p, 1, 1);
    RETURN_IF_ERROR(reader.Read(got, count - got.size()));
  }
  return absl::OkStatus();
}

struct Pair {
  std::unique_ptr<FrameLink> client, server;
};

Pair Connected(const Listener& listener, FrameLink::Options options = {}) {
  Pair p;
  absl::StatusOr<std::unique_ptr<FrameLink>> c =
      FrameLink::Connect("127.0.0.1", listener.port(), options);
  EXPECT_TRUE(c.ok()) << c.status();
  p.client = *std::move(c);
  p.server = std::make_unique<FrameLink>(listener.Accept(), options);
  std::vector<ReceivedMessage> hello;
  EXPECT_TRUE(Pump(*p.client, *p.server, hello, 1).ok());
  EXPECT_EQ(hello.size(), 1u);
  if (!hello.empty()) {
    EXPECT_EQ(hello[0].type, FrameLink::kHelloType);
    EXPECT_EQ(hello[0].payload, FrameLink::kHelloPayload);
  }
  return p;
}

TEST(FrameLinkTest, CarriesMessagesBothWaysInOrder) {
  Listener listener;
  Pair p = Connected(listener);
  kvserve::v1::GenerateRequest request;
  request.set_request_id("r1");
  for (int id = 0; id < 1000; ++id) request.add_prompt_token_ids(id);
  ASSERT_OK(p.client->Queue(request));
  ASSERT_OK(p.client->Queue("Control", ""));
  ASSERT_OK(p.client->Queue("GenerateResponse", "xyz"));
  std::vector<ReceivedMessage> got;
  ASSERT_OK(Pump(*p.client, *p.server, got, 3));
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].type, "GenerateRequest");
  kvserve::v1::GenerateRequest parsed;
  ASSERT_OK(ParseMessage(got[0], &parsed));
  EXPECT_EQ(parsed.request_id(), "r1");
  EXPECT_EQ(parsed.prompt_token_ids_size(), 1000);
  EXPECT_EQ(got[1].type, "Control");
  EXPECT_EQ(got[1].payload, "");
  EXPECT_EQ(got[2].payload, "xyz");

  ASSERT_OK(p.server->Queue("GenerateResponse", "back"));
  std::vector<ReceivedMessage> back;
  ASSERT_OK(Pump(*p.server, *p.client, back, 1));
  ASSERT_EQ(back.size(), 1u);
  EXPECT_EQ(back[0].payload, "back");
}

TEST(FrameLinkTest, AMessageLargerThanTheSocketBufferArrivesWhole) {
  Listener listener;
  Pair p = Connected(listener);
  const int small = 16 << 10;
  setsockopt(p.client->fd(), SOL_SOCKET, SO_SNDBUF, &small, sizeof(small));
  std::string big(3 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131 + (i >> 13));
  ASSERT_OK(p.client->Queue("KvChunk", big));
  ASSERT_OK(p.client->Queue("KvChunk", "after"));
  ASSERT_OK(p.client->Flush());
  EXPECT_TRUE(p.client->wants_write());  // the socket took part of it
  std::vector<ReceivedMessage> got;
  for (int i = 0; i < 20000 && got.size() < 2; ++i) {
    pollfd fds[] = {{p.client->fd(), POLLOUT, 0}, {p.server->fd(), POLLIN, 0}};
    poll(fds, 2, 10);
    ASSERT_OK(p.client->Flush());
    ASSERT_OK(p.server->Read(got, 2 - got.size()));
  }
  ASSERT_EQ(got.size(), 2u);
  EXPECT_TRUE(got[0].payload == big);
  EXPECT_EQ(got[1].payload, "after");
  EXPECT_FALSE(p.client->wants_write());
}

TEST(FrameLinkTest, ReadHandsOutAtMostWhatIsAskedAndSaysTheRestWaits) {
  Listener listener;
  Pair p = Connected(listener);
  for (int i = 0; i < 5; ++i) ASSERT_OK(p.client->Queue("M", std::to_string(i)));
  ASSERT_OK(p.client->Flush());
  pollfd w{p.server->fd(), POLLIN, 0};
  poll(&w, 1, 1000);
  std::vector<ReceivedMessage> got;
  ASSERT_OK(p.server->Read(got, 2));
  EXPECT_EQ(got.size(), 2u);
  EXPECT_TRUE(p.server->has_unread());
  ASSERT_OK(p.server->Read(got, 10));
  ASSERT_EQ(got.size(), 5u);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(got[i].payload, std::to_string(i));
  EXPECT_FALSE(p.server->has_unread());
}

TEST(FrameLinkTest, ALengthOverTheLimitBreaksTheLinkAndSaysSo) {
  Listener listener;
  Pair p = Connected(listener, {.max_message_bytes = 1024});
  // A header claiming 1 GB, written raw (Queue refuses to make one).
  const unsigned char header[] = {0x00, 0x00, 0x00, 0x40, 0x01, 'M'};
  ASSERT_EQ(send(p.client->fd(), header, sizeof(header), 0), static_cast<ssize_t>(sizeof(header)));
  std::vector<ReceivedMessage> got;
  absl::Status s;
  for (int i = 0; i < 1000 && s.ok(); ++i) s = p.server->Read(got, 10);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kDataLoss, HasSubstr("1073741824 bytes")));
  EXPECT_TRUE(p.server->broken());
  EXPECT_THAT(p.server->Queue("M", "x"),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("bytes")));
  EXPECT_THAT(p.client->Queue("M", std::string(2000, 'x')),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("over the link's limit")));
}

TEST(FrameLinkTest, AMalformedTypeLengthBreaksTheLink) {
  Listener listener;
  Pair p = Connected(listener);
  const unsigned char header[] = {0x02, 0x00, 0x00, 0x00, 0x05, 'M'};  // type of 5 in 1 byte
  ASSERT_EQ(send(p.client->fd(), header, sizeof(header), 0), static_cast<ssize_t>(sizeof(header)));
  std::vector<ReceivedMessage> got;
  absl::Status s;
  for (int i = 0; i < 1000 && s.ok(); ++i) s = p.server->Read(got, 10);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kDataLoss, HasSubstr("type is 5")));
}

TEST(FrameLinkTest, APeerThatClosesIsSeenAfterWhatItSent) {
  Listener listener;
  Pair p = Connected(listener);
  ASSERT_OK(p.client->Queue("M", "last words"));
  ASSERT_OK(p.client->Flush());
  p.client.reset();
  std::vector<ReceivedMessage> got;
  absl::Status s;
  for (int i = 0; i < 1000 && s.ok(); ++i) {
    pollfd w{p.server->fd(), POLLIN, 0};
    poll(&w, 1, 1);
    s = p.server->Read(got, 10);
  }
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("closed")));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].payload, "last words");
}

TEST(FrameLinkTest, QueueRefusesPastItsBoundWhileThePeerDoesNotRead) {
  Listener listener;
  Pair p = Connected(listener, {.max_queued_bytes = 64 << 10});
  ASSERT_OK(p.client->Queue("M", std::string(40 << 10, 'x')));
  EXPECT_THAT(p.client->Queue("M", std::string(40 << 10, 'y')),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("not reading")));
  EXPECT_LT(p.client->queued_bytes(), size_t{64 << 10});  // nothing of the refused one
  ASSERT_OK(p.client->Flush());                           // the peer's buffers take it
  ASSERT_OK(p.client->Queue("M", std::string(40 << 10, 'y')));
}

TEST(FrameLinkTest, ConnectTakesAddressesOnly) {
  EXPECT_THAT(FrameLink::Connect("worker-0.example", 5580, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not an IP address")));
  EXPECT_THAT(FrameLink::Connect("127.0.0.1", 0, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("out of range")));
  // An IPv6 address in brackets is an address (this machine may have no IPv6 route).
  EXPECT_NE(FrameLink::Connect("[::1]", 5580, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(FrameLinkTest, ARefusedConnectBreaksTheLinkAtFlush) {
  int port = 0;
  {
    Listener closed;  // a port that was free a moment ago and listens no more
    port = closed.port();
  }
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<FrameLink> link, FrameLink::Connect("127.0.0.1", port, {}));
  absl::Status s;
  for (int i = 0; i < 1000 && s.ok(); ++i) {
    pollfd w{link->fd(), POLLOUT, 0};
    poll(&w, 1, 1);
    s = link->Flush();
  }
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("refused")));
  EXPECT_TRUE(link->broken());
}

}  // namespace
}  // namespace kvserve
