// The worker's side of the wire contract (proto/kvserve/v1/kvserve.proto). In: a GenerateRequest
// read once into what the worker runs, the engine's request (worker/request/request.h) and what the
// server keeps for its replies. Out: the engine's tokens' logprobs, finish reasons and cache
// media in their wire form. RequestFromWire is the one place where the wire's zero values
// become the engine's defaults (top_p 0, n 0 and repetition_penalty 0 read as 1: proto3 sends
// no "unset"), and where a request carrying fields this build does not know (a newer router's)
// is refused, naming them, instead of being served without them.
//
//   ASSIGN_OR_RETURN(WireRequest w, RequestFromWire(request));
//   engine.AddRequest(std::move(w.input));
//   delta.set_finish_reason(ToWire(output.finish_reason));
//
// Pure functions; any thread. Ranges are the engine's to check (Engine::AddRequest).
#ifndef KVSERVE_WORKER_SERVER_WIRE_H_
#define KVSERVE_WORKER_SERVER_WIRE_H_

#include "absl/status/statusor.h"
#include "kvserve/v1/kvserve.pb.h"
#include "worker/kv_cache/kv_cache_manager.h"
#include "worker/request/request.h"

namespace kvserve::worker {

struct WireRequest {
  RequestInput input;  // for Engine::AddRequest
  // For the server's replies: streamed deltas or one reply per sample, and the router's
  // prediction of the prompt tokens cached here (-1 is none; compared in metrics).
  bool stream = false;
  int predicted_cached_tokens = 0;
  // The placing router replica and its number for the request, for the load reports
  // (load_reports.h; empty and 0: not numbered).
  std::string router_id;
  uint64_t placement = 0;
};

// InvalidArgument naming the field for unknown fields (in the request or any message in it) or
// an unknown constraint kind.
absl::StatusOr<WireRequest> RequestFromWire(const kvserve::v1::GenerateRequest& req);

void ToWire(const TokenLogprobs& lp, kvserve::v1::PositionLogprobs* out);
kvserve::v1::FinishReason ToWire(FinishReason r);  // kNone: UNSPECIFIED (still running)
kvserve::v1::Medium ToWire(Medium m);
// A failure as the wire carries it (Error: code and message).
void ToWire(const absl::Status& s, kvserve::v1::Error* out);

}  // namespace kvserve::worker

#endif  // KVSERVE_WORKER_SERVER_WIRE_H_
