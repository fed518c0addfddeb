// CURVE keys and the ZAP handler over real TCP sockets: only allowed client keys get through,
// on ROUTER/DEALER and PUB/SUB alike; a plain client, an unknown key and a client that expects
// another server get nothing; a key added to the directory is let in without a restart.
#include "common/net/curve.h"

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/escaping.h"
#include "common/file_util.h"
#include "common/net/zmq_framing.h"
#include "gtest/gtest.h"
#include "tests/testing/paths.h"
#include "tests/testing/status_matchers.h"

namespace kvserve {
namespace {

using ::kvserve::testing::MakeTempDir;
using ::kvserve::testing::StatusIs;
using ::testing::HasSubstr;

TEST(CurveKeysTest, FilesRoundTripAndNameWhatIsWrong) {
  ASSERT_OK_AND_ASSIGN(CurveKeyPair pair, GenerateCurveKeyPair());
  ASSERT_EQ(pair.public_key.size(), 40u);
  ASSERT_OK_AND_ASSIGN(std::string derived, CurvePublicKey(pair.secret_key));
  EXPECT_EQ(derived, pair.public_key);

  const std::string text = FormatCurveKeyFile({true, pair.secret_key}, "one\ntwo");
  EXPECT_EQ(text.rfind("# one\n# two\nsecret ", 0), 0u) << text;
  ASSERT_OK_AND_ASSIGN(CurveKeyFile parsed, ParseCurveKeyFile(text));
  EXPECT_TRUE(parsed.secret);
  EXPECT_EQ(parsed.key, pair.secret_key);

  // base64 of the same 32 bytes reads as the same key (Helm's randBytes writes base64).
  char raw[32];
  ASSERT_NE(zmq_z85_decode(reinterpret_cast<uint8_t*>(raw), pair.public_key.c_str()), nullptr);
  const std::string b64 = absl::Base64Escape(std::string(raw, 32));
  ASSERT_OK_AND_ASSIGN(parsed, ParseCurveKeyFile("public   " + b64 + "  \r\n\n"));
  EXPECT_FALSE(parsed.secret);
  EXPECT_EQ(parsed.key, pair.public_key);

  EXPECT_THAT(ParseCurveKeyFile(""),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("found 0 lines")));
  EXPECT_THAT(ParseCurveKeyFile("public a\npublic b"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("found 2 lines")));
  EXPECT_THAT(
      ParseCurveKeyFile("private " + pair.public_key),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"public KEY\" or \"secret KEY\"")));
  EXPECT_THAT(
      ParseCurveKeyFile("public " + pair.public_key.substr(1)),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("this one has 39 characters")));
  EXPECT_THAT(ParseCurveKeyFile("public " + std::string(40, '"')),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("Z85")));
  EXPECT_THAT(ParseCurveKeyFile("public " + std::string(44, '!')),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("44")));
}

TEST(CurveKeysTest, WritesPrivateFilesOnceAndReadsThemBack) {
  const std::string dir = MakeTempDir();
  ASSERT_OK_AND_ASSIGN(CurveKeyPair pair, GenerateCurveKeyPair());
  ASSERT_OK(WriteCurveKeyFile(dir + "/a.key", {true, pair.secret_key}, "a"));
  ASSERT_OK(WriteCurveKeyFile(dir + "/a.pub", {false, pair.public_key}, "a"));
  struct stat st;
  ASSERT_EQ(stat((dir + "/a.key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_THAT(WriteCurveKeyFile(dir + "/a.key", {true, pair.secret_key}, "again"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("File exists")));

  ASSERT_OK_AND_ASSIGN(CurveKeyPair read, ReadCurveKeyPair(dir + "/a.key"));
  EXPECT_EQ(read.public_key, pair.public_key);
  EXPECT_THAT(ReadCurveKeyPair(dir + "/a.pub"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("holds a public key")));
  // A secret-key file stands for its public half.
  EXPECT_EQ(*ReadCurvePublicKey(dir + "/a.key"), pair.public_key);
  EXPECT_EQ(*ReadCurvePublicKey(dir + "/a.pub"), pair.public_key);
}

TEST(CurveKeysTest, AllowedClientsSkipKubernetesBookkeepingAndRefuseJunk) {
  const std::string dir = MakeTempDir();
  EXPECT_THAT(ReadAllowedClients(dir),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("holds no client key")));
  EXPECT_THAT(ReadAllowedClients(dir + "/missing"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("missing")));
  ASSERT_OK_AND_ASSIGN(CurveKeyPair a, GenerateCurveKeyPair());
  ASSERT_OK_AND_ASSIGN(CurveKeyPair b, GenerateCurveKeyPair());
  // A mounted Secret: ..data/ holds the files, the visible names are links into it.
  std::filesystem::create_directories(dir + "/..data");
  ASSERT_OK(WriteCurveKeyFile(dir + "/..data/router-a.pub", {false, a.public_key}, ""));
  std::filesystem::create_symlink("..data/router-a.pub", dir + "/router-a.pub");
  ASSERT_OK(WriteCurveKeyFile(dir + "/router-b.key", {true, b.secret_key}, ""));
  ASSERT_OK_AND_ASSIGN(std::vector<AllowedClient> allowed, ReadAllowedClients(dir));
  ASSERT_EQ(allowed.size(), 2u);
  EXPECT_EQ(allowed[0].name, "router-a");
  EXPECT_EQ(allowed[0].public_key, a.public_key);
  EXPECT_EQ(allowed[1].name, "router-b");
  EXPECT_EQ(allowed[1].public_key, b.public_key);
  std::ofstream(dir + "/junk.pub") << "not a key\n";
  EXPECT_THAT(ReadAllowedClients(dir),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("junk.pub")));
}

TEST(CurveKeysTest, LoopbackHosts) {
  for (const char* h : {"127.0.0.1", "127.1.2.3", "localhost", "::1", "[::1]"}) {
    EXPECT_TRUE(IsLoopbackHost(h)) << h;
  }
  for (const char* h : {"0.0.0.0", "10.0.0.1", "::", "*", "1127.0.0.1", ""}) {
    EXPECT_FALSE(IsLoopbackHost(h)) << h;
  }
}

// A CURVE server (ROUTER and PUB) with its ZAP handler, as a worker runs them.
class CurveLinkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(server_keys_, GenerateCurveKeyPair());
    ASSERT_OK_AND_ASSIGN(allowed_, GenerateCurveKeyPair());
    ASSERT_OK_AND_ASSIGN(stranger_, GenerateCurveKeyPair());
    ASSERT_OK_AND_ASSIGN(own_front_, GenerateCurveKeyPair());
    dir_ = MakeTempDir();
    ASSERT_OK(WriteCurveKeyFile(dir_ + "/router.pub", {false, allowed_.public_key}, ""));
    ASSERT_OK_AND_ASSIGN(
        zap_, ZapAuthenticator::Start(ctx_, dir_, {{"openai-front", own_front_.public_key}}));
    for (zmq::socket_t* s : {&router_, &pub_}) {
      s->set(zmq::sockopt::linger, 0);
      ASSERT_OK(MakeCurveServer(*s, server_keys_.secret_key));
      s->bind("tcp://127.0.0.1:*");
    }
  }
  void TearDown() override {
    router_.close();
    pub_.close();
    zap_.reset();
  }

  std::unique_ptr<zmq::socket_t> Connect(zmq::socket_type type, zmq::socket_t& server,
                                         const CurveKeyPair* own, const std::string& server_key) {
    auto s = std::make_unique<zmq::socket_t>(ctx_, type);
    s->set(zmq::sockopt::linger, 0);
    if (own != nullptr) {
      EXPECT_OK(MakeCurveClient(*s, *own, server_key));
    }
    if (type == zmq::socket_type::sub) s->set(zmq::sockopt::subscribe, "");
    s->connect(server.get(zmq::sockopt::last_endpoint));
    return s;
  }

  // Whether `client` (a DEALER) reaches the server within timeout_ms (a message sent while it
  // has no connection is refused or dropped, so it sends again until then).
  bool Reaches(zmq::socket_t& client, int timeout_ms = 500) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (std::chrono::steady_clock::now() < deadline) {
      const std::string_view hello[] = {"hello"};
      SendFrames(client, hello, zmq::send_flags::dontwait).IgnoreError();
      zmq::pollitem_t item{router_.handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, std::chrono::milliseconds(50));
      if (!(item.revents & ZMQ_POLLIN)) continue;
      auto frames = ReceiveFrames(router_);
      return frames.ok() && frames->has_value() && (**frames).back() == "hello";
    }
    return false;
  }

  // Whether `sub` hears the server's PUB within timeout_ms.
  bool Hears(zmq::socket_t& sub, int timeout_ms = 500) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (std::chrono::steady_clock::now() < deadline) {
      const std::string_view news[] = {"status", "news"};
      EXPECT_OK(SendFrames(pub_, news));
      zmq::pollitem_t item{sub.handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, std::chrono::milliseconds(20));
      if (item.revents & ZMQ_POLLIN) return true;
    }
    return false;
  }

  zmq::context_t ctx_;
  CurveKeyPair server_keys_, allowed_, stranger_;
  CurveKeyPair own_front_;  // allowed in-process, not in the directory
  std::string dir_;
  std::unique_ptr<ZapAuthenticator> zap_;
  zmq::socket_t router_{ctx_, zmq::socket_type::router};
  zmq::socket_t pub_{ctx_, zmq::socket_type::pub};
};

TEST_F(CurveLinkTest, OnlyAnAllowedKeyGetsThrough) {
  auto plain = Connect(zmq::socket_type::dealer, router_, nullptr, "");
  auto stranger = Connect(zmq::socket_type::dealer, router_, &stranger_, server_keys_.public_key);
  // The allowed key, but it expects another server: the client refuses the handshake.
  ASSERT_OK_AND_ASSIGN(CurveKeyPair other_server, GenerateCurveKeyPair());
  auto misdirected = Connect(zmq::socket_type::dealer, router_, &allowed_, other_server.public_key);
  EXPECT_FALSE(Reaches(*plain));
  EXPECT_FALSE(Reaches(*stranger));
  EXPECT_FALSE(Reaches(*misdirected));
  auto good = Connect(zmq::socket_type::dealer, router_, &allowed_, server_keys_.public_key);
  EXPECT_TRUE(Reaches(*good, 5000));
  EXPECT_GE(zap_->refused(), 1);
  EXPECT_EQ(zap_->accepted(), 1);

  auto eavesdropper = Connect(zmq::socket_type::sub, pub_, &stranger_, server_keys_.public_key);
  auto plain_sub = Connect(zmq::socket_type::sub, pub_, nullptr, "");
  auto subscriber = Connect(zmq::socket_type::sub, pub_, &allowed_, server_keys_.public_key);
  EXPECT_TRUE(Hears(*subscriber, 5000));
  EXPECT_FALSE(Hears(*eavesdropper));
  EXPECT_FALSE(Hears(*plain_sub));
}

TEST_F(CurveLinkTest, AKeyAddedToTheDirectoryIsLetInWithoutARestart) {
  auto refused = Connect(zmq::socket_type::dealer, router_, &stranger_, server_keys_.public_key);
  EXPECT_FALSE(Reaches(*refused));
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));  // the handler re-reads ≤ 1/s
  ASSERT_OK(WriteCurveKeyFile(dir_ + "/second-router.pub", {false, stranger_.public_key}, ""));
  // libzmq 4.3 never retries a connection whose handshake was refused: a new one is needed (the
  // router makes new sockets for a silent worker, worker_pool.h).
  auto retried = Connect(zmq::socket_type::dealer, router_, &stranger_, server_keys_.public_key);
  EXPECT_TRUE(Reaches(*retried, 5000));
  std::filesystem::remove(dir_ + "/second-router.pub");
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  auto removed = Connect(zmq::socket_type::dealer, router_, &stranger_, server_keys_.public_key);
  EXPECT_FALSE(Reaches(*removed));
}

// The key a worker's own OpenAI front makes at start is allowed beside the directory's, and
// stays allowed when the directory is read again.
TEST_F(CurveLinkTest, AKeyAllowedInProcessOutlivesDirectoryReloads) {
  auto front = Connect(zmq::socket_type::dealer, router_, &own_front_, server_keys_.public_key);
  EXPECT_TRUE(Reaches(*front, 5000));
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));  // the handler re-reads ≤ 1/s
  ASSERT_OK(WriteCurveKeyFile(dir_ + "/second-router.pub", {false, stranger_.public_key}, ""));
  auto again = Connect(zmq::socket_type::dealer, router_, &own_front_, server_keys_.public_key);
  EXPECT_TRUE(Reaches(*again, 5000));
  EXPECT_EQ(zap_->accepted(), 2);
}

}  // namespace
}  // namespace kvserve
