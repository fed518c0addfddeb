// The front end's Prometheus metrics, in the one registry its /metrics serves: requests by
// endpoint and status, connections (open, refused at the cap, dropped for not reading), the
// core's admission (queue depth and waits, refusals), time to first token, end-to-end latency
// and the front's own added latency. A core with more to say extends it (router/router_metrics.h
// adds placement's, in the same registry). Thread-safe (prometheus-cpp).
//
// The names keep their kvserve_router_ prefix: kvserve-worker --openai-port serves the same
// front, and dashboards and alerts read one set of names from both.
#ifndef KVSERVE_FRONTEND_CORE_FRONT_METRICS_H_
#define KVSERVE_FRONTEND_CORE_FRONT_METRICS_H_

#include <memory>
#include <string>

#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace kvserve::frontend {

class FrontMetrics {
 public:
  FrontMetrics();
  virtual ~FrontMetrics() = default;
  FrontMetrics(const FrontMetrics&) = delete;
  FrontMetrics& operator=(const FrontMetrics&) = delete;

  void CountRequest(const std::string& endpoint, int status);
  // HTTP connections: open now (+1 / -1), refused at the cap, dropped for not reading their
  // stream (frontend/http/http_connection.h).
  void AddOpenConnections(int delta);
  [[nodiscard]] int open_connections() const {
    return static_cast<int>(open_connections_->Value());
  }
  void CountRefusedConnection();
  void CountSlowClient();
  // Admission (frontend/core/core.h): requests waiting for a worker with room, how long each waited
  // when it left the queue for a worker, and requests refused ("queue_full", "queue_timeout")
  // or ended at their deadline ("deadline").
  void SetQueueDepth(int depth);
  void ObserveQueueWait(double seconds);
  void CountRejected(const std::string& reason);
  // The front's and core's own part of a request's latency: "to_worker" from the request's last
  // byte to its GenerateRequest on the way to the worker (parsing, tokenization, hashing,
  // placement), "to_client" from a stream's first reply at the core to its chunk handed to the
  // socket.
  void ObserveAdded(const std::string& stage, double seconds);
  void ObserveTtft(double seconds);
  void ObserveE2e(double seconds);
  // Every family of the registry, as Prometheus text.
  [[nodiscard]] std::string Serialize() const;

 protected:
  // Where an extension registers its families (constant after construction).
  [[nodiscard]] prometheus::Registry& registry() const { return *registry_; }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Gauge* queue_depth_;
  prometheus::Histogram* queue_wait_;
  prometheus::Family<prometheus::Counter>* rejected_;
  prometheus::Gauge* open_connections_;
  prometheus::Counter *refused_connections_, *slow_clients_;
};

}  // namespace kvserve::frontend

#endif  // KVSERVE_FRONTEND_CORE_FRONT_METRICS_H_
