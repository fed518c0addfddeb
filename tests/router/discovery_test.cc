// DNS worker discovery: the NAME:PORT:EVENTS_PORT spec, the system resolver on "localhost"
// (failures are exercised with a resolver of the test's own: no network lookups here),
// periodic re-resolution reporting only changes, and a failed resolution keeping the last set.
#include "router/discovery.h"

#include <atomic>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace kvserve::router {
namespace {

TEST(DiscoveryTest, ParsesTheTarget) {
  ASSERT_OK_AND_ASSIGN(DnsTarget t, ParseDnsTarget("kvserve-workers.serving.svc:5570:5571"));
  EXPECT_EQ(t.name, "kvserve-workers.serving.svc");
  EXPECT_EQ(t.port, 5570);
  EXPECT_EQ(t.events_port, 5571);
  for (const char* bad : {"", "name", "name:1", "name:1:x", ":1:2", "name:0:2", "name:1:70000"}) {
    const auto r = ParseDnsTarget(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("--workers-dns"), std::string::npos);
  }
}

TEST(DiscoveryTest, ResolvesLocalhost) {
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> a, ResolveHost("localhost"));
  EXPECT_NE(std::find(a.begin(), a.end(), "127.0.0.1"), a.end());
}

TEST(DiscoveryTest, ReportsChangesAndKeepsTheLastSetOnFailure) {
  std::mutex mu;
  absl::StatusOr<std::vector<std::string>> answer =
      std::vector<std::string>{"10.0.0.2", "10.0.0.1"};
  std::atomic<int> calls{0};
  auto resolver = [&](const std::string& name) -> absl::StatusOr<std::vector<std::string>> {
    EXPECT_EQ(name, "svc");
    ++calls;
    std::lock_guard<std::mutex> lock(mu);
    return answer;
  };
  DnsDiscovery d({"svc", 5570, 5571}, absl::Milliseconds(20), resolver);
  auto first = d.TakeIfChanged();  // resolved in the constructor
  ASSERT_TRUE(first.has_value());
  ASSERT_EQ(first->size(), 2u);
  EXPECT_EQ((*first)[0].name, "10.0.0.2:5570:5571");
  EXPECT_EQ((*first)[1].host, "10.0.0.1");
  EXPECT_EQ((*first)[1].events_port, 5571);
  auto wait_calls = [&](int n) {
    for (int i = 0; i < 500 && calls < n; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
  };
  wait_calls(3);
  EXPECT_FALSE(d.TakeIfChanged().has_value());  // same answer: no change
  {
    std::lock_guard<std::mutex> lock(mu);
    answer = absl::UnavailableError("SERVFAIL");
  }
  const int before = calls;
  wait_calls(before + 3);
  EXPECT_FALSE(d.TakeIfChanged().has_value());  // failures keep the last good set
  EXPECT_GE(d.failures(), 1);
  {
    std::lock_guard<std::mutex> lock(mu);
    answer = std::vector<std::string>{"10.0.0.1", "fd00::7"};
  }
  std::optional<std::vector<WorkerEndpoint>> next;
  for (int i = 0; i < 500 && !next; ++i) {
    next = d.TakeIfChanged();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(next.has_value());
  ASSERT_EQ(next->size(), 2u);
  EXPECT_EQ((*next)[1].name, "[fd00::7]:5570:5571");  // IPv6 bracketed
}

// A hostile or runaway DNS answer cannot make the router open sockets past ZeroMQ's limit.
TEST(DiscoveryTest, CapsTheWorkersOfOneAnswer) {
  auto resolver = [](const std::string&) -> absl::StatusOr<std::vector<std::string>> {
    std::vector<std::string> many;
    for (int i = 0; i < 600; ++i) many.push_back(absl::StrCat("10.0.", i / 256, ".", i % 256));
    return many;
  };
  DnsDiscovery d({"svc", 5570, 5571}, absl::Hours(1), resolver);
  auto first = d.TakeIfChanged();
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->size(), kMaxDiscoveredWorkers);
}

}  // namespace
}  // namespace kvserve::router
