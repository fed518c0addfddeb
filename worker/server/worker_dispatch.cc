// WorkerServer: the ROUTER socket's traffic. Requests, aborts and controls in (HandleMessage),
// generation admitted through RequestFromWire (wire.h), the engine's outputs out as numbered
// replies (SendOutputs, Respond) through the reply queue.
#include <algorithm>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "worker/server/process_clock.h"
#include "worker/server/wire.h"
#include "worker/server/worker_server.h"

namespace kvserve::worker {

namespace pb = ::kvserve::v1;

void WorkerServer::Reply(const std::string& identity, const google::protobuf::Message& m) {
  KVSERVE_CHECK_THREAD(loop_thread_);
  replies_->Send(identity, m);
}

void WorkerServer::Respond(Route& route, pb::GenerateResponse& r) {
  KVSERVE_CHECK_THREAD(loop_thread_);
  r.set_seq(++route.seq);
  Reply(route.identity, r);
}

void WorkerServer::FlushReplies() {
  KVSERVE_CHECK_THREAD(loop_thread_);
  for (const std::string& peer : replies_->Flush(Clock::now())) AbortRequestsOf(peer);
  if (links_) {  // a turn's replies to a link leave in one write
    std::vector<std::string> closed;
    links_->Flush(closed);
    for (const std::string& peer : closed) AbortRequestsOf(peer);
  }
}

void WorkerServer::AbortRequestsOf(const std::string& peer) {
  KVSERVE_CHECK_THREAD(loop_thread_);
  for (auto it = routes_.begin(); it != routes_.end();) {
    if (it->second.identity != peer) {
      ++it;
      continue;
    }
    engine_->Abort(it->first).IgnoreError();
    metrics_->CountRequestEnd("abort");
    routes_.erase(it++);
  }
}

void WorkerServer::SendError(const std::string& identity, const std::string& request_id,
                             const absl::Status& status, uint32_t seq) {
  KVSERVE_CHECK_THREAD(loop_thread_);
  pb::GenerateResponse r;
  r.set_request_id(request_id);
  r.set_seq(seq);
  r.set_finish_reason(pb::FINISH_REASON_ERROR);
  r.mutable_error()->set_code(static_cast<int>(status.code()));
  r.mutable_error()->set_message(std::string(status.message()));
  Reply(identity, r);
  if (seq == 1) layer_streams_->Fail(request_id, status);  // refused: its stream never starts
}

void WorkerServer::HandleMessage(const ReceivedMessage& m) {
  KVSERVE_CHECK_THREAD(loop_thread_);
  if (m.type == "GenerateRequest") {
    pb::GenerateRequest req;
    if (absl::Status s = ParseMessage(m, &req); !s.ok()) {
      metrics_->CountDropped("malformed_payload");
      SendError(m.prefix, "", s, /*seq=*/0);
      return;
    }
    HandleGenerate(m.prefix, req);
  } else if (m.type == "AbortRequest") {
    pb::AbortRequest req;
    if (!ParseMessage(m, &req).ok()) {
      metrics_->CountDropped("malformed_payload");
      return;
    }
    auto it = routes_.find(req.request_id());
    if (it == routes_.end() || !engine_->Abort(req.request_id()).ok()) {
      metrics_->CountDropped("abort_unknown_request");
      return;
    }
    pb::GenerateResponse r;
    r.set_request_id(req.request_id());
    r.set_finish_reason(pb::FINISH_REASON_ABORT);
    r.mutable_error()->set_code(static_cast<int>(absl::StatusCode::kCancelled));
    r.mutable_error()->set_message(req.reason().empty() ? "aborted" : req.reason());
    Respond(it->second, r);
    routes_.erase(it);
    metrics_->CountRequestEnd("abort");
  } else if (m.type == "KvExportRequest" || m.type == "KvChunk") {
    kv_transfers_->OnMessage(m, drain_->draining() ? &drain_->reason() : nullptr,
                             [&](const std::string& id) {
                               KVSERVE_CHECK_THREAD(loop_thread_);  // called back on this thread
                               return routes_.contains(id);
                             });
  } else if (m.type == "LinkSubscribe") {
    // A framed link's router takes the published stream on the link from now: a status at once
    // tells it the link carries it.
    if (links_ == nullptr || !links_->Subscribe(m.prefix)) {
      metrics_->CountDropped("subscribe_not_on_a_link");
      return;
    }
    PublishStatus();
  } else if (m.type == "KvLinkOpen" || m.type == "KvLinkClose") {
    kv_links_->OnMessage(m);
  } else if (m.type == "Control") {
    pb::Control c;
    if (!ParseMessage(m, &c).ok()) {
      metrics_->CountDropped("malformed_payload");
      pb::ControlReply r;
      r.mutable_error()->set_code(static_cast<int>(absl::StatusCode::kInvalidArgument));
      r.mutable_error()->set_message("malformed Control payload");
      Reply(m.prefix, r);
      return;
    }
    HandleControl(m.prefix, c);
  } else {
    metrics_->CountDropped("unknown_type");
    pb::ControlReply r;
    r.mutable_error()->set_code(static_cast<int>(absl::StatusCode::kInvalidArgument));
    r.mutable_error()->set_message(
        absl::StrCat("unknown message type '", absl::CHexEscape(m.type.substr(0, 64)), "'"));
    Reply(m.prefix, r);
  }
}

void WorkerServer::HandleGenerate(const std::string& identity, const pb::GenerateRequest& req) {
  KVSERVE_CHECK_THREAD(loop_thread_);
  load_reports_.Took(req.router_id(), req.placement(), NowMs());
  if (drain_->draining()) {
    SendError(
        identity, req.request_id(),
        absl::FailedPreconditionError(absl::StrCat("worker is draining (", drain_->reason(), ")")));
    return;
  }
  if (routes_.contains(req.request_id())) {
    metrics_->CountDropped("duplicate_request_id");
    SendError(identity, req.request_id(),
              absl::AlreadyExistsError(
                  absl::StrCat("request '", req.request_id(), "' is already running")));
    return;
  }
  absl::StatusOr<WireRequest> wire = RequestFromWire(req);
  if (!wire.ok()) {
    metrics_->CountDropped("unknown_fields");
    SendError(identity, req.request_id(), wire.status());
    return;
  }
  const int n = wire->input.sampling.n;
  const int max_tokens = wire->input.max_tokens;
  if (absl::Status s = engine_->AddRequest(std::move(wire->input)); !s.ok()) {
    SendError(identity, req.request_id(), s);
    return;
  }
  Route route;
  route.identity = identity;
  route.stream = wire->stream;
  route.arrival = Clock::now();
  route.predicted_cached = wire->predicted_cached_tokens;
  route.n = n;
  route.max_tokens = max_tokens;
  if (!route.stream) route.pending.resize(n);
  routes_.emplace(req.request_id(), std::move(route));
  layer_streams_->Start(req.request_id());
}

FinishedRequest WorkerServer::Finished(const Route& route, const SequenceOutput& o,
                                       Clock::time_point now) {
  const auto scheduled = route.scheduled == Clock::time_point() ? now : route.scheduled;
  const auto first = route.first_token == Clock::time_point() ? now : route.first_token;
  const auto last = route.last_token == Clock::time_point() ? now : route.last_token;
  FinishedRequest f;
  f.e2e = Seconds(now - route.arrival);
  f.queue = Seconds(scheduled - route.arrival);
  f.tpot = route.completion_tokens > 1 ? Seconds(last - first) / (route.completion_tokens - 1) : 0;
  f.prefill = Seconds(first - scheduled);
  f.decode = Seconds(last - first);
  f.inference = Seconds(last - scheduled);
  f.prompt_tokens = o.num_prompt_tokens;
  f.generation_tokens = route.completion_tokens;
  f.n = route.n;
  f.max_tokens = route.max_tokens;
  f.reason = o.finish_reason == FinishReason::kLength ? "length" : "stop";
  return f;
}

void WorkerServer::SendOutputs(std::vector<SequenceOutput>& outs) {
  KVSERVE_CHECK_THREAD(loop_thread_);
  const auto now = Clock::now();
  // Before the replies go out: a client that scrapes /metrics after its answer sees its request
  // counted, not the last heartbeat's numbers.
  if (std::any_of(outs.begin(), outs.end(),
                  [](const SequenceOutput& o) { return o.request_finished; })) {
    UpdateMetrics(/*refresh_kv_usage=*/false);
  }
  for (SequenceOutput& o : outs) {
    auto it = routes_.find(o.request_id);
    if (it == routes_.end()) continue;
    Route& route = it->second;
    route.completion_tokens += static_cast<int>(o.new_tokens.size());
    if (!o.new_tokens.empty()) {
      if (route.first_token == Clock::time_point()) {
        route.first_token = now;
        metrics_->ObserveFirstToken(Seconds(now - route.arrival));
      } else {
        metrics_->ObserveInterToken(Seconds(now - route.last_token));
      }
      route.last_token = now;
    }
    pb::GenerateResponse delta;
    delta.set_request_id(o.request_id);
    delta.set_sample_index(o.sample_index);
    for (int32_t t : o.new_tokens) delta.add_token_ids(t);
    for (const TokenLogprobs& lp : o.new_logprobs) ToWire(lp, delta.add_logprobs());
    for (const TokenLogprobs& lp : o.prompt_logprobs) ToWire(lp, delta.add_prompt_logprobs());
    delta.set_finish_reason(ToWire(o.finish_reason));
    if (o.stop_token) delta.set_stop_token_id(*o.stop_token);
    if (o.request_finished) {
      pb::Usage* u = delta.mutable_usage();
      u->set_prompt_tokens(o.num_prompt_tokens);
      u->set_cached_prompt_tokens(o.num_cached_prompt_tokens);
      // Counted before the last reply goes out (a scrape after the answer sees it).
      metrics_->ObserveFinished(Finished(route, o, now));
    }
    if (route.stream) {
      Respond(route, delta);
    } else {
      pb::GenerateResponse& acc = route.pending[o.sample_index];
      acc.set_request_id(o.request_id);
      acc.set_sample_index(o.sample_index);
      acc.mutable_token_ids()->MergeFrom(delta.token_ids());
      acc.mutable_logprobs()->MergeFrom(delta.logprobs());
      acc.mutable_prompt_logprobs()->MergeFrom(delta.prompt_logprobs());
      if (delta.finish_reason() != pb::FINISH_REASON_UNSPECIFIED) {
        acc.set_finish_reason(delta.finish_reason());
        if (delta.has_stop_token_id()) acc.set_stop_token_id(delta.stop_token_id());
      }
      if (o.request_finished) *acc.mutable_usage() = delta.usage();
    }
    if (o.request_finished) {
      if (!route.stream) {
        int completion = 0;
        for (const auto& p : route.pending) completion += p.token_ids_size();
        for (auto& p : route.pending) {
          if (p.has_usage()) p.mutable_usage()->set_completion_tokens(completion);
          Respond(route, p);
        }
      }
      ++served_requests_;
      routes_.erase(it);
    }
  }
}

}  // namespace kvserve::worker
