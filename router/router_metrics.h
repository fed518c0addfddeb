// The router's Prometheus metrics: requests by endpoint and status, routing decisions by
// policy reason, predicted prefix overlap against the cached tokens workers report (routing
// accuracy), time to first token and end-to-end latency. Thread-safe (prometheus-cpp).
#ifndef KVSERVE_ROUTER_ROUTER_METRICS_H_
#define KVSERVE_ROUTER_ROUTER_METRICS_H_

#include <memory>
#include <string>

#include "prometheus/registry.h"

namespace kvserve::router {

class RouterMetrics {
 public:
  RouterMetrics();
  void CountRequest(const std::string& endpoint, int status);
  // One routed request: why, and to which worker (by its name).
  void CountDecision(const std::string& reason, const std::string& worker);
  void CountCached(int64_t predicted_tokens, int64_t reported_tokens);
  void ObserveTtft(double seconds);
  void ObserveE2e(double seconds);
  [[nodiscard]] std::string Serialize() const;

 private:
  std::shared_ptr<prometheus::Registry> registry_;
};

}  // namespace kvserve::router

#endif  // KVSERVE_ROUTER_ROUTER_METRICS_H_
