// The Responses stores (frontend/store/response_store.h): the embedded one's expiry, byte bound
// and tenants; which store a flag names, and a Redis URL refused by what is wrong with it; a
// Redis store whose server is down answers Unavailable naming it. The Redis store against a
// real redis-server: tests/node/responses_api_test.mjs.
#include "frontend/store/response_store.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "frontend/store/memory_response_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace kvserve::frontend {
namespace {

using ::testing::HasSubstr;

absl::Time fake_now = absl::UnixEpoch();
absl::Time FakeNow() { return fake_now; }

TEST(MemoryResponseStoreTest, RecordsExpireAfterTheirTtl) {
  MemoryResponseStore store(absl::Seconds(10), 1 << 20);
  store.set_clock(FakeNow);
  fake_now = absl::UnixEpoch();
  ASSERT_OK(store.Put("t", "resp_a", "A"));
  fake_now += absl::Seconds(5);
  ASSERT_OK(store.Put("t", "resp_b", "B"));
  fake_now += absl::Seconds(6);  // a is 11 s old, b 6 s
  EXPECT_EQ(*store.Get("t", "resp_a"), std::nullopt);
  EXPECT_EQ(*store.Get("t", "resp_b"), "B");
  EXPECT_EQ(store.size(), 1u);
}

TEST(MemoryResponseStoreTest, TheOldestGoPastTheBoundAndBytesAreCounted) {
  MemoryResponseStore store(absl::Hours(1), 100);
  ASSERT_OK(store.Put("", "r1", std::string(40, 'x')));
  ASSERT_OK(store.Put("", "r2", std::string(40, 'y')));
  EXPECT_EQ(store.bytes(), 2 * (3 + 40));  // the key (tenant "", ':', id) and the record
  ASSERT_OK(store.Put("", "r3", std::string(40, 'z')));  // 129 bytes: r1 goes
  EXPECT_EQ(*store.Get("", "r1"), std::nullopt);
  EXPECT_EQ(**store.Get("", "r2"), std::string(40, 'y'));
  ASSERT_OK(store.Put("", "r2", "short"));  // replaced, not counted twice
  EXPECT_EQ(store.bytes(), (3 + 5) + (3 + 40));
  EXPECT_THAT(store.Put("", "big", std::string(200, 'b')),
              testing::StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("204 bytes")));
  EXPECT_EQ(store.size(), 2u);
}

TEST(MemoryResponseStoreTest, TenantsSeeOnlyTheirOwn) {
  MemoryResponseStore store(absl::Hours(1), 1 << 20);
  const std::string a = TenantOf("key-a"), b = TenantOf("key-b");
  EXPECT_NE(a, b);
  EXPECT_EQ(a.size(), 32u);
  EXPECT_EQ(a.find("key-a"), std::string::npos);
  EXPECT_EQ(TenantOf(""), "");
  ASSERT_OK(store.Put(a, "resp_1", "mine"));
  EXPECT_EQ(*store.Get(b, "resp_1"), std::nullopt);
  EXPECT_FALSE(*store.Delete(b, "resp_1"));
  EXPECT_EQ(*store.Get(a, "resp_1"), "mine");
  EXPECT_TRUE(*store.Delete(a, "resp_1"));
  EXPECT_FALSE(*store.Delete(a, "resp_1"));
  EXPECT_EQ(*store.Get(a, "resp_1"), std::nullopt);
}

TEST(ResponseStoreTest, TheFlagNamesTheStoreAndBadOnesAreRefusedByName) {
  EXPECT_EQ(*MakeResponseStore({.url = "none"}), nullptr);
  EXPECT_NE(*MakeResponseStore({.url = "memory"}), nullptr);
  EXPECT_NE(*MakeResponseStore({.url = "redis://127.0.0.1:6379"}), nullptr);  // lazily connected
  EXPECT_NE(*MakeResponseStore({.url = "redis://:secret@[::1]:6380/2"}), nullptr);
  for (const auto& [url, why] : std::vector<std::pair<std::string, std::string>>{
           {"memcached://h:1", "is not one of memory, none"},
           {"redis://host", "needs HOST:PORT"},
           {"redis://host:0", "the port must be 1-65535"},
           {"redis://host:6379/x", "the database must be a number"},
           {"redis://secret@host:6379", "the password must follow ':'"}}) {
    EXPECT_THAT(MakeResponseStore({.url = url}).status(),
                testing::StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(why)))
        << url;
  }
  EXPECT_FALSE(MakeResponseStore({.url = "memory", .ttl = absl::ZeroDuration()}).ok());
}

TEST(ResponseStoreTest, ARedisStoreWithNoServerIsUnavailableNamingIt) {
  // A port taken and closed at once: nothing listens there.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  socklen_t len = sizeof(a);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  close(fd);
  const std::string where = "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
  ASSERT_OK_AND_ASSIGN(auto store, MakeResponseStore({.url = "redis://" + where}));
  EXPECT_THAT(store->Get("", "resp_1").status(),
              testing::StatusIs(absl::StatusCode::kUnavailable, HasSubstr(where)));
  EXPECT_THAT(store->Put("", "resp_1", "x"),
              testing::StatusIs(absl::StatusCode::kUnavailable, HasSubstr(where)));
}

}  // namespace
}  // namespace kvserve::frontend
