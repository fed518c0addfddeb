#include "router/discovery.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "glog/logging.h"

namespace kvserve::router {

absl::StatusOr<DnsTarget> ParseDnsTarget(std::string_view spec) {
  std::vector<std::string> parts = absl::StrSplit(std::string(spec), ':');
  DnsTarget t;
  if (parts.size() != 3 || parts[0].empty() || !absl::SimpleAtoi(parts[1], &t.port) ||
      !absl::SimpleAtoi(parts[2], &t.events_port) || t.port <= 0 || t.port > 65535 ||
      t.events_port <= 0 || t.events_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--workers-dns '", std::string(spec), "' is not NAME:PORT:EVENTS_PORT"));
  }
  t.name = parts[0];
  return t;
}

absl::StatusOr<std::vector<std::string>> ResolveHost(const std::string& name) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  if (int rc = getaddrinfo(name.c_str(), nullptr, &hints, &result); rc != 0) {
    return absl::UnavailableError(absl::StrCat("resolving '", name, "': ", gai_strerror(rc)));
  }
  std::vector<std::string> out;
  for (addrinfo* a = result; a != nullptr; a = a->ai_next) {
    char buf[INET6_ADDRSTRLEN] = {};
    const void* src =
        a->ai_family == AF_INET
            ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr)
            : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr);
    if (inet_ntop(a->ai_family, src, buf, sizeof(buf)) != nullptr) out.emplace_back(buf);
  }
  freeaddrinfo(result);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

DnsDiscovery::DnsDiscovery(DnsTarget target, absl::Duration period, Resolver resolver)
    : target_(std::move(target)), period_(period), resolver_(std::move(resolver)) {
  ResolveOnce();
  thread_ = std::thread([this] { RefreshLoop(); });
}

void DnsDiscovery::RefreshLoop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      const absl::Time next = absl::Now() + period_;
      while (!stop_) {
        if (cv_.WaitWithDeadline(&mu_, next)) break;  // the period passed
      }
      if (stop_) return;
    }
    ResolveOnce();
  }
}

DnsDiscovery::~DnsDiscovery() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.SignalAll();
  if (thread_.joinable()) thread_.join();
}

void DnsDiscovery::ResolveOnce() {
  absl::StatusOr<std::vector<std::string>> addresses = resolver_(target_.name);
  absl::MutexLock lock(&mu_);
  if (!addresses.ok()) {
    ++failures_;
    LOG(WARNING) << "worker discovery: " << addresses.status().message()
                 << "; keeping the last known workers";
    return;
  }
  if (addresses->size() > kMaxDiscoveredWorkers) {
    LOG_EVERY_T(WARNING, 60) << "worker discovery: " << target_.name << " has " << addresses->size()
                             << " addresses; keeping the first " << kMaxDiscoveredWorkers;
    addresses->resize(kMaxDiscoveredWorkers);
  }
  if (!have_latest_ || *addresses != latest_) {
    latest_ = *std::move(addresses);
    have_latest_ = true;
    changed_ = true;
  }
}

std::optional<std::vector<WorkerEndpoint>> DnsDiscovery::TakeIfChanged() {
  absl::MutexLock lock(&mu_);
  if (!changed_) return std::nullopt;
  changed_ = false;
  std::vector<WorkerEndpoint> out;
  for (const std::string& a : latest_) {
    WorkerEndpoint e;
    e.port = target_.port;
    e.events_port = target_.events_port;
    // IPv6 addresses are bracketed in names and ZeroMQ endpoints.
    const std::string host = a.find(':') != std::string::npos ? absl::StrCat("[", a, "]") : a;
    e.host = host;
    e.name = absl::StrCat(host, ":", e.port, ":", e.events_port);
    out.push_back(std::move(e));
  }
  return out;
}

int64_t DnsDiscovery::failures() const {
  absl::MutexLock lock(&mu_);
  return failures_;
}

}  // namespace kvserve::router
