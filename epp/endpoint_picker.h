// kvserve's endpoint picker: Envoy's ext_proc v3 gRPC service (envoy.service.ext_proc.v3.
// ExternalProcessor/Process), answering a Gateway API Inference Extension gateway which of the
// InferencePool's pods takes each request (ext_proc_exchange.h has the protocol), with the
// router's own policy, books and admission (router_core.h: a pick is a request placed but never
// sent). Also the gRPC health service (grpc.health.v1.Health) with the protocol's services:
// "liveness" (always SERVING), "readiness" and "envoy.service.ext_proc.v3.ExternalProcessor"
// (SERVING while an endpoint is eligible), and "" (the server).
//
//   ASSIGN_OR_RETURN(std::unique_ptr<EndpointPicker> epp,
//                    EndpointPicker::Start(options, &tokenizer, &core, &metrics));
//   ...
//   epp->Stop();
//
// Threads: gRPC's own run each stream's callbacks (reading, tokenizing, writing); the router's
// core thread hands picks back; one thread of its own updates the health statuses.
#ifndef KVSERVE_EPP_ENDPOINT_PICKER_H_
#define KVSERVE_EPP_ENDPOINT_PICKER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/tokenizer/tokenizer.h"
#include "epp/ext_proc_exchange.h"
#include "epp/pick_request.h"
#include "frontend/core/core.h"
#include "frontend/core/front_metrics.h"

namespace kvserve::epp {

struct EndpointPickerOptions {
  std::string host = "0.0.0.0";
  int port = 9002;    // 0: any free port
  int fallbacks = 2;  // endpoints named after the pick, for the gateway's retries
  ExchangeOptions exchange;
  PickOptions pick;
};

class EndpointPicker {
 public:
  // Serves until Stop; `tokenizer`, `core` and `metrics` (optional) must outlive it.
  static absl::StatusOr<std::unique_ptr<EndpointPicker>> Start(
      const EndpointPickerOptions& options, const tokenizer::Tokenizer* tokenizer,
      frontend::Core* core, frontend::FrontMetrics* metrics);
  ~EndpointPicker();
  [[nodiscard]] int port() const;
  // Health turns NOT_SERVING (the gateway stops opening streams), the ext_proc streams get up to
  // `grace` to end (one opened meanwhile is still served), then the server stops, cutting what
  // is left (health Watch streams among it). Idempotent.
  void Stop(absl::Duration grace = absl::Seconds(5));

  struct Impl;

 private:
  explicit EndpointPicker(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvserve::epp

#endif  // KVSERVE_EPP_ENDPOINT_PICKER_H_
