// kvserve's generation messages as an OpenAI-compatible server's /v1/completions speaks them,
// for the upstream bridge (upstream_bridge.h): a GenerateRequest becomes a streamed completions
// request whose prompt is the token ids, with return_token_ids (vLLM 0.10.2 on, and kvserve) and
// return_tokens_as_token_ids, so that what comes back is token ids, never text to re-tokenize;
// the server-sent events become GenerateResponse deltas as a kvserve worker sends them.
//
//   ASSIGN_OR_RETURN(std::string body, UpstreamCompletionBody(request, "llama"));
//   UpstreamStreamReader reader(request);
//   RETURN_IF_ERROR(reader.Feed(bytes, &deltas));   // as the bytes arrive
//   RETURN_IF_ERROR(reader.Finish(&deltas));        // at the end of the body
//
// Pure; an UpstreamStreamReader belongs to one request's thread.
#ifndef KVSERVE_UPSTREAM_COMPLETION_WIRE_H_
#define KVSERVE_UPSTREAM_COMPLETION_WIRE_H_

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvserve/v1/kvserve.pb.h"

namespace kvserve::upstream {

// The JSON body, or InvalidArgument naming a parameter an OpenAI upstream cannot be asked for
// by token ids (bad_words, structured outputs, prompt_logprobs, logprob_token_ids).
absl::StatusOr<std::string> UpstreamCompletionBody(const kvserve::v1::GenerateRequest& request,
                                                   const std::string& model);

class UpstreamStreamReader {
 public:
  explicit UpstreamStreamReader(const kvserve::v1::GenerateRequest& request);

  // Reads `bytes` of the event stream; appends the deltas they complete. InvalidArgument for an
  // event that is not the completions stream's JSON (naming what is missing); an `error`
  // event becomes a final delta with the error.
  absl::Status Feed(std::string_view bytes, std::vector<kvserve::v1::GenerateResponse>* out);
  // The body ended: the held-back last delta goes out (with usage counted here if the server
  // sent none). Unavailable if a sample never finished (the stream broke off).
  absl::Status Finish(std::vector<kvserve::v1::GenerateResponse>* out);
  [[nodiscard]] bool finished() const { return finished_; }

 private:
  absl::Status Event(std::string_view data, std::vector<kvserve::v1::GenerateResponse>* out);
  absl::Status Choice(const void* choice_json, std::vector<kvserve::v1::GenerateResponse>* out);
  void Release(std::vector<kvserve::v1::GenerateResponse>* out);

  std::string request_id_;
  int n_ = 1;
  int prompt_tokens_ = 0;
  bool want_logprobs_ = false;
  int top_logprobs_ = 0;
  std::string pending_;  // bytes of an event not complete yet
  std::vector<bool> sample_done_;
  std::vector<int> last_token_;
  int completion_tokens_ = 0;
  std::optional<kvserve::v1::GenerateResponse> held_;  // the last sample's final delta
  std::optional<kvserve::v1::Usage> usage_;
  bool finished_ = false;
};

// The final delta of a request the upstream refused: its HTTP status as an absl code, and the
// error message from an OpenAI error body (or the body's start).
kvserve::v1::GenerateResponse UpstreamRefusal(const std::string& request_id, int http_status,
                                              std::string_view body);

}  // namespace kvserve::upstream

#endif  // KVSERVE_UPSTREAM_COMPLETION_WIRE_H_
