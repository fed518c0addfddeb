// Worker discovery by DNS: a name such as a Kubernetes headless Service
// ("kvserve-workers.serving.svc.cluster.local") resolves to one address per worker pod; every
// address becomes a worker at the given ports. The name is re-resolved periodically on a
// thread of its own; the router's core takes each changed set and adds or removes workers.
// A failed resolution keeps the last good set (a DNS hiccup must not empty the cluster).
//
//   ASSIGN_OR_RETURN(DnsTarget t, ParseDnsTarget("kvserve-workers:5570:5571"));
//   DnsDiscovery d(t, absl::Seconds(10));
//   if (auto endpoints = d.TakeIfChanged()) core.SyncWorkers(*endpoints);
#ifndef KVSERVE_ROUTER_DISCOVERY_H_
#define KVSERVE_ROUTER_DISCOVERY_H_

#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "router/worker_pool.h"

namespace kvserve::router {

struct DnsTarget {
  std::string name;
  int port = 0, events_port = 0;
};

// "NAME:PORT:EVENTS_PORT"; InvalidArgument naming --workers-dns otherwise.
absl::StatusOr<DnsTarget> ParseDnsTarget(std::string_view spec);

// Addresses of `name` (IPv4 and IPv6, numeric, sorted, without duplicates), via getaddrinfo.
absl::StatusOr<std::vector<std::string>> ResolveHost(const std::string& name);

// The most workers one DNS answer may add: each takes two ZeroMQ sockets, and past ZeroMQ's
// socket limit (1023 by default) the router could open no more. A larger answer keeps the first
// this many addresses (sorted) and says so in the log.
inline constexpr size_t kMaxDiscoveredWorkers = 256;

class DnsDiscovery {
 public:
  using Resolver = std::function<absl::StatusOr<std::vector<std::string>>(const std::string&)>;

  // Resolves once before returning (so a router starts with its workers), then every period.
  DnsDiscovery(DnsTarget target, absl::Duration period, Resolver resolver = ResolveHost);
  ~DnsDiscovery();
  DnsDiscovery(const DnsDiscovery&) = delete;
  DnsDiscovery& operator=(const DnsDiscovery&) = delete;

  // The endpoints of the latest good resolution when they differ from the last ones taken.
  std::optional<std::vector<WorkerEndpoint>> TakeIfChanged() ABSL_LOCKS_EXCLUDED(mu_);
  // Resolutions that failed so far (for the router's metrics and logs).
  int64_t failures() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void ResolveOnce() ABSL_LOCKS_EXCLUDED(mu_);
  void RefreshLoop() ABSL_LOCKS_EXCLUDED(mu_);

  // Constant after construction.
  DnsTarget target_;
  absl::Duration period_;
  Resolver resolver_;

  mutable absl::Mutex mu_;
  absl::CondVar cv_;  // signalled on stop
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::string> latest_ ABSL_GUARDED_BY(mu_);
  bool have_latest_ ABSL_GUARDED_BY(mu_) = false;
  bool changed_ ABSL_GUARDED_BY(mu_) = false;
  int64_t failures_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace kvserve::router

#endif  // KVSERVE_ROUTER_DISCOVERY_H_
