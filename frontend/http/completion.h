// One OpenAI completion (/v1/completions or /v1/chat/completions) from its admitted request to
// its last byte: a job per prompt to the core (frontend/core/core.h), then each worker reply turned
// into the client's response. A reply's tokens go through the choice's detokenizer and its output
// pipeline (frontend/output/output_pipeline.h: stop strings, reasoning, tool calls); its logprobs
// and the choices become OpenAI's JSON (frontend/output/openai_json.h), whole or as server-sent
// events.
//
//   auto c = std::make_shared<Completion>(ctx, conn, std::move(parsed));
//   boost::asio::dispatch(c->strand(), [c, ...] { c->Start(prompts, max_tokens, ...); });
//
// Owned by the jobs' response callbacks and the connection's gone callback; lives until all
// are dropped. Runs on its strand of the handler threads: one of its steps at a time, in order.
#ifndef KVSERVE_FRONTEND_HTTP_COMPLETION_H_
#define KVSERVE_FRONTEND_HTTP_COMPLETION_H_

#include <boost/asio/strand.hpp>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/tokenizer/incremental_detokenizer.h"
#include "frontend/core/core.h"
#include "frontend/http/front_context.h"
#include "frontend/http/http_connection.h"
#include "frontend/output/api_output.h"
#include "frontend/output/openai_json.h"
#include "frontend/output/output_pipeline.h"
#include "frontend/request/openai_request.h"
#include "kvserve/v1/kvserve.pb.h"
#include "nlohmann/json.hpp"

namespace kvserve::frontend {

class Completion : public std::enable_shared_from_this<Completion> {
 public:
  using Clock = std::chrono::steady_clock;

  Completion(FrontContext& ctx, std::shared_ptr<HttpConnection> conn, ParsedRequest req)
      : ctx_(ctx),
        conn_(std::move(conn)),
        req_(std::move(req)),
        strand_(boost::asio::make_strand(ctx.handlers)) {}
  [[nodiscard]] const auto& strand() const { return strand_; }
  // Answers in another API's shape (one choice; frontend/output/api_output.h) instead of chat's;
  // before Start.
  void set_output(std::unique_ptr<ApiOutput> out) { output_ = std::move(out); }

  // Places a job per prompt (`prompts`: their ids; `max_tokens` per choice); `session_header`
  // is the X-Session-Id header; `deadline` when it must have ended; `received` when its HTTP
  // request was read. On the strand.
  void Start(std::vector<std::vector<int>> prompts, int max_tokens,
             const std::string& session_header, Clock::time_point deadline,
             Clock::time_point received);

 private:
  // One prompt of the request (completions may send a list): its job on a worker.
  struct PromptJob {
    std::vector<int> ids;
    std::string job_id;  // the request id the worker knows it by
    std::string echo;    // the text its choices start with, with echo
    bool ended = false;  // its last reply came, or it was aborted
    int cached = 0;
    std::vector<kvserve::v1::PositionLogprobs> prompt_logprobs;  // from its first reply
  };
  // One choice's decoding state.
  struct Choice {
    int prompt = 0;  // its PromptJob
    std::unique_ptr<tokenizer::IncrementalDetokenizer> detok;
    OutputPipeline output;
    bool has_reasoning = false;  // chat with a reasoning parser: reasoning_content is returned
    std::string text;            // generated (after the echo)
    int tokens = 0;
    bool done = false;
    bool echoed = false;           // its prompt's echo went out (stream) or was taken (whole)
    bool role_sent = false;        // chat streams send the role in a choice's first chunk
    bool prompt_ids_sent = false;  // completions' return_token_ids: its prompt's ids went out
    std::string finish;
    std::string stop_string;  // the one that ended it
    std::string reasoning_text;
    std::vector<ParsedToolCall> calls;
    std::vector<int> token_ids;                         // taken, with return_token_ids
    nlohmann::json logprobs = nlohmann::json::array();  // chat: content entries
    LegacyLogprobs legacy;                              // completions
    int64_t offset = 0;  // completions: characters before the next logprobs token
  };
  // What one reply adds to a choice: text to send, logprobs entries in the endpoint's shape.
  struct ChoiceDelta {
    std::string echo;            // the prompt's, in the choice's first delta
    OutputDelta out;             // content, reasoning_content, tool calls
    std::vector<int> token_ids;  // with return_token_ids
    nlohmann::json chat_logprobs = nlohmann::json::array();
    LegacyLogprobs legacy;
    [[nodiscard]] bool has_logprobs() const { return !chat_logprobs.empty() || !legacy.empty(); }
  };

  [[nodiscard]] std::shared_ptr<Job> MakeJob(const PromptJob& p) const;
  [[nodiscard]] std::string EchoText(size_t prompt) const;
  // The choice's output pipeline, as the request's parameters ask.
  void BuildOutput(Choice& c, const std::vector<std::string>& tool_names) const;
  // `arrived`: when the reply reached the core.
  void OnResponse(size_t prompt, const kvserve::v1::GenerateResponse& r, Clock::time_point arrived);
  // Whether `r` ends the request with an error, which it then reports.
  bool HandleFailure(const kvserve::v1::GenerateResponse& r);
  // The echo of the choice's prompt (text, and prompt logprobs with logprobs), once.
  void Echo(Choice& c, ChoiceDelta& d);
  // Decodes `r`'s tokens through the choice's pipeline into `d`; ends the choice on a stop
  // string or the worker's finish reason.
  void Decode(Choice& c, const kvserve::v1::GenerateResponse& r, ChoiceDelta& d);
  // How the output carries tool calls; none for tool_choice none.
  [[nodiscard]] std::optional<ToolOutput> ToolFormat() const;
  // With a reasoning parser: whether the chat prompt opened the block, so the output starts
  // in it (then a constraint holds after the block).
  void StartReasoning(const std::vector<int>& prompt);
  void AddLogprobs(Choice& c, int id, const kvserve::v1::PositionLogprobs& p, ChoiceDelta& d);
  // The chosen token first, then the top `wanted`.
  [[nodiscard]] nlohmann::ordered_json LegacyTop(const std::string& token,
                                                 const kvserve::v1::PositionLogprobs& p,
                                                 int wanted) const;
  void SendChunk(int index, const ChoiceDelta& d, const std::string& finish);
  // Ends the prompt's job (aborting it on its worker when it still runs) and, the last one,
  // the request.
  void EndPrompt(size_t prompt, bool abort);
  void AbortAll();
  void Finish();
  void FinishOutput();  // Finish, through output_
  [[nodiscard]] ApiUsage OutputUsage() const;
  [[nodiscard]] nlohmann::ordered_json Usage() const;
  [[nodiscard]] nlohmann::ordered_json ChoiceLogprobs(const Choice& c) const;
  [[nodiscard]] nlohmann::ordered_json ChoicesJson() const;
  [[nodiscard]] bool PromptDone(size_t prompt) const;
  [[nodiscard]] bool AllChoicesDone() const;
  [[nodiscard]] std::string TokenText(int id) const;
  // A token as logprobs name it: its text, or "token_id:ID" with return_tokens_as_token_ids
  // (vLLM's, for tokens whose bytes are not whole UTF-8).
  [[nodiscard]] std::string LogprobToken(int id) const;

  FrontContext& ctx_;
  std::shared_ptr<HttpConnection> conn_;
  ParsedRequest req_;
  std::string request_id_;   // the router's: the worker jobs' ids derive from it
  std::string response_id_;  // the answer's `id`: the client's request_id when it gave one
  int64_t created_ = 0;
  int max_tokens_ = 0;  // per choice: a worker's tokens past it are not taken
  std::vector<PromptJob> prompts_;
  std::vector<Choice> choices_;  // prompt-major, then n (OpenAI's index)
  Clock::time_point start_;
  bool first_token_seen_ = false;
  bool finished_ = false;
  // A stream's header goes out with its first response, so that a request refused before it
  // ran (the router's queue full, say) gets its own status, not an error inside a 200.
  bool stream_started_ = false;
  bool first_chunk_sent_ = false;
  bool reasoning_inside_ = false;      // the chat prompt opened a reasoning block
  std::unique_ptr<ApiOutput> output_;  // set: the answer is in that API's shape
  boost::asio::strand<boost::asio::any_io_executor> strand_;
};

}  // namespace kvserve::frontend

#endif  // KVSERVE_FRONTEND_HTTP_COMPLETION_H_
