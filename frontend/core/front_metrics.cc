#include "frontend/core/front_metrics.h"

#include "prometheus/text_serializer.h"

namespace kvserve::frontend {
namespace {

const prometheus::Histogram::BucketBoundaries& Buckets() {
  static const prometheus::Histogram::BucketBoundaries b = {
      0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
  return b;
}

}  // namespace

FrontMetrics::FrontMetrics() : registry_(std::make_shared<prometheus::Registry>()) {
  auto gauge = [&](const char* name, const char* help) {
    return &prometheus::BuildGauge().Name(name).Help(help).Register(*registry_);
  };
  auto counter = [&](const char* name, const char* help) {
    return &prometheus::BuildCounter().Name(name).Help(help).Register(*registry_);
  };
  queue_depth_ =
      &gauge("kvserve_router_queue_depth", "Requests waiting at the router for a worker with room")
           ->Add({});
  queue_wait_ = &prometheus::BuildHistogram()
                     .Name("kvserve_router_queue_wait_seconds")
                     .Help("Time a request waited at the router for a worker with room")
                     .Register(*registry_)
                     .Add({}, Buckets());
  rejected_ = counter("kvserve_router_rejected_requests_total",
                      "Requests refused for overload (queue_full, queue_timeout: 429) or ended at "
                      "their deadline (deadline: 504)");
  for (const char* reason : {"queue_full", "queue_timeout", "deadline"}) {
    rejected_->Add({{"reason", reason}});
  }
  open_connections_ = &gauge("kvserve_router_open_connections", "HTTP connections open")->Add({});
  refused_connections_ =
      &counter("kvserve_router_connections_refused_total",
               "HTTP connections refused with a 503 because --max-connections were open")
           ->Add({});
  slow_clients_ = &counter("kvserve_router_slow_clients_total",
                           "Streaming clients dropped (their request aborted) because they did not "
                           "read: a write made no progress, or too much of the stream waited")
                       ->Add({});
}

void FrontMetrics::CountRequest(const std::string& endpoint, int status) {
  prometheus::BuildCounter()
      .Name("kvserve_router_requests_total")
      .Help("HTTP requests by endpoint and status")
      .Register(*registry_)
      .Add({{"endpoint", endpoint}, {"status", std::to_string(status)}})
      .Increment();
}

void FrontMetrics::SetQueueDepth(int depth) { queue_depth_->Set(depth); }

void FrontMetrics::ObserveQueueWait(double seconds) { queue_wait_->Observe(seconds); }

void FrontMetrics::CountRejected(const std::string& reason) {
  rejected_->Add({{"reason", reason}}).Increment();
}

void FrontMetrics::AddOpenConnections(int delta) { open_connections_->Increment(delta); }

void FrontMetrics::CountRefusedConnection() { refused_connections_->Increment(); }

void FrontMetrics::CountSlowClient() { slow_clients_->Increment(); }

void FrontMetrics::ObserveAdded(const std::string& stage, double s) {
  static const prometheus::Histogram::BucketBoundaries kFine = {
      25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3};
  prometheus::BuildHistogram()
      .Name("kvserve_router_added_latency_seconds")
      .Help("The router's own part of a request's latency, by stage (to_worker, to_client)")
      .Register(*registry_)
      .Add({{"stage", stage}}, kFine)
      .Observe(s);
}

void FrontMetrics::ObserveTtft(double s) {
  prometheus::BuildHistogram()
      .Name("kvserve_router_time_to_first_token_seconds")
      .Help("Time to the first token, seen at the router")
      .Register(*registry_)
      .Add({}, Buckets())
      .Observe(s);
}

void FrontMetrics::ObserveE2e(double s) {
  prometheus::BuildHistogram()
      .Name("kvserve_router_e2e_request_latency_seconds")
      .Help("Request latency, seen at the router")
      .Register(*registry_)
      .Add({}, Buckets())
      .Observe(s);
}

std::string FrontMetrics::Serialize() const {
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

}  // namespace kvserve::frontend
