// One HTTP request's ext_proc stream (Envoy's external processing, v3) as kvserve's endpoint
// picker answers it, per the Gateway API Inference Extension's endpoint-picker protocol (v1.0.0,
// docs/proposals/004-endpoint-picker-protocol): read the request's headers and body, ask for its
// endpoints once, then name them in the x-gateway-destination-endpoint header and the envoy.lb
// dynamic metadata ("ip:port,ip:port,...": the pick, then its fallbacks), or answer with an
// immediate response (503: no eligible endpoint, 429: shed, 400: a body that cannot be read).
//
// Body modes (the filter's request_body_mode, from the stream's protocol_config when Envoy sends
// it, else ExchangeOptions): FULL_DUPLEX_STREAMED, as the extension's gateways configure it (the
// headers' answer waits for the whole body; the body goes back as streamed chunks); BUFFERED
// (headers answered at once, the endpoint set with the body's answer); NONE (picked on the
// headers, by load). STREAMED and BUFFERED_PARTIAL cannot carry a pick (Envoy forwards the
// headers before the body is seen): such a stream ends with FAILED_PRECONDITION naming the mode.
//
// Not thread-safe: its stream (ext_proc_server.cc) serializes the calls.
#ifndef KVSERVE_EPP_EXT_PROC_EXCHANGE_H_
#define KVSERVE_EPP_EXT_PROC_EXCHANGE_H_

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "envoy/service/ext_proc/v3/external_processor.pb.h"
#include "frontend/output/openai_error.h"

namespace kvserve::epp {

namespace ext_proc = ::envoy::service::ext_proc::v3;

// The protocol's names (metadata namespaces and keys, the header).
inline constexpr char kSubsetNamespace[] = "envoy.lb.subset_hint";
inline constexpr char kSubsetKey[] = "x-gateway-destination-endpoint-subset";
inline constexpr char kDestinationNamespace[] = "envoy.lb";
inline constexpr char kDestinationKey[] = "x-gateway-destination-endpoint";
inline constexpr char kServedKey[] = "x-gateway-destination-endpoint-served";

struct ExchangeOptions {
  // The body modes assumed when the stream's first message carries no protocol_config (Envoy
  // before 1.35): the gateway's configuration must match.
  ext_proc::BodySendMode request_body_mode = ext_proc::FULL_DUPLEX_STREAMED;
  ext_proc::BodySendMode response_body_mode = ext_proc::NONE;
  size_t max_body_bytes = 16 << 20;  // a larger request body gets a 413
  size_t chunk_bytes = 64 << 10;     // streamed body chunks sent back at most this long
};

// What the picker needs to place the request.
struct PickAsk {
  std::string path;                                // :path
  std::string body;                                // the whole request body (empty: none)
  std::string session_id;                          // x-session-id, for the session policy
  std::optional<std::vector<std::string>> subset;  // the subset hint; unset: any endpoint
};

class ExtProcExchange {
 public:
  explicit ExtProcExchange(ExchangeOptions options) : o_(options) {}

  // The answers to `m`, in order (none while the pick is awaited). Once `pick_ask()` is set
  // after a call, the caller asks for the endpoints and hands back Picked or Refused. An error
  // ends the stream with that status (a mode that cannot carry a pick).
  absl::StatusOr<std::vector<ext_proc::ProcessingResponse>> OnMessage(
      const ext_proc::ProcessingRequest& m);
  // Set once, when the request has been read whole: take it (the second call returns nullopt).
  std::optional<PickAsk> TakePickAsk();
  // The answers that the pick completes: the endpoints, best first (never empty).
  std::vector<ext_proc::ProcessingResponse> Picked(const std::vector<std::string>& endpoints);
  // An immediate response with the error's status and OpenAI-style body.
  std::vector<ext_proc::ProcessingResponse> Refused(const frontend::OpenAiError& error);

  // The model server's response began (its headers came): the request is prefilled.
  [[nodiscard]] bool response_started() const { return response_started_; }
  // The response has ended (or was refused): the pick may leave the books.
  [[nodiscard]] bool finished() const { return finished_; }
  // The endpoint that served it, when the gateway reported one (envoy.lb metadata).
  [[nodiscard]] const std::string& served() const { return served_; }

 private:
  enum class Phase { kHeaders, kBody, kAsked, kPicked };
  absl::Status ReadMode(const ext_proc::ProcessingRequest& m);
  void OnRequestHeaders(const ext_proc::ProcessingRequest& m,
                        std::vector<ext_proc::ProcessingResponse>& out);
  void OnRequestBody(const ext_proc::HttpBody& b, std::vector<ext_proc::ProcessingResponse>& out);
  void OnResponse(const ext_proc::ProcessingRequest& m,
                  std::vector<ext_proc::ProcessingResponse>& out);
  void Ask();

  ExchangeOptions o_;
  bool mode_read_ = false;
  Phase phase_ = Phase::kHeaders;
  bool picked_on_headers_ = false;  // no body: the endpoint goes in the headers' answer
  bool trailers_pending_ = false;   // request trailers came before the pick: answer after it
  std::optional<PickAsk> ask_;      // set when read whole, taken by TakePickAsk
  PickAsk request_;                 // what has been read so far
  bool response_started_ = false, finished_ = false;
  std::string served_;
};

}  // namespace kvserve::epp

#endif  // KVSERVE_EPP_EXT_PROC_EXCHANGE_H_
