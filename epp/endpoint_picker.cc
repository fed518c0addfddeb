#include "epp/endpoint_picker.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <atomic>
#include <deque>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "envoy/service/ext_proc/v3/external_processor.grpc.pb.h"
#include "glog/logging.h"

namespace kvserve::epp {

using frontend::Core;
using frontend::FrontMetrics;
using frontend::Job;
using frontend::OpenAiError;
using frontend::OpenAiErrorFromStatus;
namespace {

constexpr char kExtProcService[] = "envoy.service.ext_proc.v3.ExternalProcessor";

// What every stream shares; constant after Start but for the id counter.
struct Shared {
  EndpointPickerOptions options;
  const tokenizer::Tokenizer* tokenizer = nullptr;
  Core* core = nullptr;
  FrontMetrics* metrics = nullptr;
  std::string id_prefix;
  std::atomic<uint64_t> next_id{1};
  std::atomic<int> open_streams{0};  // ext_proc streams not yet done (Stop waits for them)
};

class PickStream;

// The core thread's way back to a stream, which may have ended meanwhile (then it is null).
struct Link {
  explicit Link(PickStream* s) : stream(s) {}
  absl::Mutex mu;
  PickStream* stream ABSL_GUARDED_BY(mu) = nullptr;
};

// One ext_proc stream (one HTTP request). gRPC runs its callbacks one read and one write at a
// time; the core thread's pick arrives on its own: mu_ orders them.
class PickStream final
    : public grpc::ServerBidiReactor<ext_proc::ProcessingRequest, ext_proc::ProcessingResponse> {
 public:
  explicit PickStream(Shared* shared)
      : shared_(shared), exchange_(shared->options.exchange), link_(std::make_shared<Link>(this)) {
    ++shared_->open_streams;
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    std::optional<PickAsk> ask;
    {
      absl::MutexLock lock(&mu_);
      if (!ok) {  // the gateway closed its side (or the stream broke)
        reads_done_ = true;
        return Settle();
      }
      absl::StatusOr<std::vector<ext_proc::ProcessingResponse>> out = exchange_.OnMessage(in_);
      if (!out.ok()) {
        Count(out.status().code() == absl::StatusCode::kFailedPrecondition ? 412 : 400);
        finish_ = grpc::Status(static_cast<grpc::StatusCode>(out.status().code()),
                               std::string(out.status().message()));
        return Settle();
      }
      Queue(*std::move(out));
      ask = exchange_.TakePickAsk();
      Settle();
    }
    if (ask) Pick(*std::move(ask));
    absl::MutexLock lock(&mu_);
    if (!finished_) StartRead(&in_);  // gRPC runs no reaction inline: safe under mu_
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) {  // the stream broke: nothing more goes out
      out_.clear();
      reads_done_ = true;
    } else {
      out_.pop_front();
    }
    Settle();
  }

  void OnDone() override {
    {
      absl::MutexLock lock(&link_->mu);
      link_->stream = nullptr;
    }
    Release();
    --shared_->open_streams;
    delete this;
  }

  // From the core thread (through the link).
  void Picked(const std::vector<std::string>& endpoints) {
    absl::MutexLock lock(&mu_);
    pending_ = false;
    Count(200);
    Queue(exchange_.Picked(endpoints));
    Settle();
  }
  void Refused(const OpenAiError& e) {
    absl::MutexLock lock(&mu_);
    pending_ = false;
    std::vector<ext_proc::ProcessingResponse> out = exchange_.Refused(e);
    if (!out.empty()) Count(e.http_status);
    Queue(std::move(out));
    Settle();
  }

 private:
  // Reads the request and hands it to the core (no lock: tokenizing takes a while).
  void Pick(PickAsk ask) {
    absl::StatusOr<PickRequest> r =
        ReadPickRequest(shared_->options.pick, *shared_->tokenizer, ask.path, ask.body);
    if (!r.ok()) return Refused(OpenAiErrorFromStatus(r.status()));
    auto job = std::make_shared<Job>();
    job->request = std::move(r->request);
    {
      absl::MutexLock lock(&mu_);
      request_id_ = absl::StrCat("epp-", shared_->id_prefix, shared_->next_id++);
      job->request.set_request_id(request_id_);
      pending_ = true;
    }
    job->session_key = std::move(ask.session_id);
    job->received = std::chrono::steady_clock::now();
    std::shared_ptr<Link> link = link_;
    job->pick = Job::Pick{.subset = std::move(ask.subset),
                          .fallbacks = shared_->options.fallbacks,
                          .on_pick = [link](const std::vector<std::string>& endpoints) {
                            absl::MutexLock lock(&link->mu);
                            if (link->stream != nullptr) link->stream->Picked(endpoints);
                          }};
    job->on_response = [link](const kvserve::v1::GenerateResponse& g) {
      if (!g.has_error()) return;
      const absl::Status s(static_cast<absl::StatusCode>(g.error().code()), g.error().message());
      absl::MutexLock lock(&link->mu);
      if (link->stream != nullptr) link->stream->Refused(OpenAiErrorFromStatus(s));
    };
    shared_->core->Submit(std::move(job));
  }

  void Queue(std::vector<ext_proc::ProcessingResponse> out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (auto& r : out) out_.push_back(std::move(r));
  }

  // Tells the core what the exchange learnt, starts the next write, and finishes the stream
  // once nothing is left to say.
  void Settle() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!request_id_.empty() && exchange_.response_started() && !started_told_) {
      started_told_ = true;
      shared_->core->Started(request_id_);
    }
    if (exchange_.finished()) ReleaseLocked();
    if (writing_ || finished_) return;
    if (!out_.empty()) {
      writing_ = true;
      return StartWrite(&out_.front());
    }
    const bool done =
        !finish_.ok() || (exchange_.finished() && !pending_) || (reads_done_ && !pending_);
    if (!done) return;
    finished_ = true;
    Finish(finish_);
  }

  void Release() {
    absl::MutexLock lock(&mu_);
    ReleaseLocked();
  }
  void ReleaseLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (released_ || request_id_.empty()) return;
    released_ = true;
    shared_->core->Abort(request_id_);  // a pick only leaves the books
  }

  void Count(int status) {
    if (shared_->metrics != nullptr) shared_->metrics->CountRequest("ext_proc", status);
  }

  Shared* const shared_;
  ext_proc::ProcessingRequest in_;  // the read in flight (gRPC's one at a time)
  absl::Mutex mu_;
  ExtProcExchange exchange_ ABSL_GUARDED_BY(mu_);
  std::deque<ext_proc::ProcessingResponse> out_ ABSL_GUARDED_BY(mu_);  // front: being written
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool pending_ ABSL_GUARDED_BY(mu_) = false;  // the core has the pick
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
  bool started_told_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status finish_ ABSL_GUARDED_BY(mu_);
  std::string request_id_ ABSL_GUARDED_BY(mu_);
  const std::shared_ptr<Link> link_;
};

class Service final : public ext_proc::ExternalProcessor::CallbackService {
 public:
  explicit Service(Shared* shared) : shared_(shared) {}
  grpc::ServerBidiReactor<ext_proc::ProcessingRequest, ext_proc::ProcessingResponse>* Process(
      grpc::CallbackServerContext* /*context*/) override {
    return new PickStream(shared_);
  }

 private:
  Shared* const shared_;
};

}  // namespace

struct EndpointPicker::Impl {
  Shared shared;
  std::unique_ptr<Service> service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
  absl::Notification stop;
  std::thread health;  // sets readiness from the core every 250 ms until stop
  std::atomic<bool> stopped{false};
};

absl::StatusOr<std::unique_ptr<EndpointPicker>> EndpointPicker::Start(
    const EndpointPickerOptions& options, const tokenizer::Tokenizer* tokenizer, Core* core,
    FrontMetrics* metrics) {
  if (options.fallbacks < 0 || options.fallbacks > 16) {
    return absl::InvalidArgumentError("--epp-fallbacks must be in 0..16");
  }
  auto impl = std::make_unique<Impl>();
  impl->shared.options = options;
  impl->shared.tokenizer = tokenizer;
  impl->shared.core = core;
  impl->shared.metrics = metrics;
  impl->shared.id_prefix = absl::StrFormat("%08x-", std::random_device{}());
  impl->service = std::make_unique<Service>(&impl->shared);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  const std::string address = absl::StrCat(options.host.find(':') != std::string::npos
                                               ? absl::StrCat("[", options.host, "]")
                                               : options.host,
                                           ":", options.port);
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &impl->port);
  builder.RegisterService(impl->service.get());
  builder.SetMaxReceiveMessageSize(static_cast<int>(options.exchange.max_body_bytes + (1 << 20)));
  impl->server = builder.BuildAndStart();
  if (impl->server == nullptr || impl->port == 0) {
    return absl::UnavailableError(absl::StrCat("the endpoint picker cannot listen on ", address));
  }
  grpc::HealthCheckServiceInterface* health = impl->server->GetHealthCheckService();
  health->SetServingStatus("liveness", true);
  Impl* raw = impl.get();
  impl->health = std::thread([raw, health] {
    do {
      const bool ready = raw->shared.core->ready();
      health->SetServingStatus("readiness", ready);
      health->SetServingStatus(kExtProcService, ready);
    } while (!raw->stop.WaitForNotificationWithTimeout(absl::Milliseconds(250)));
  });
  return std::unique_ptr<EndpointPicker>(new EndpointPicker(std::move(impl)));
}

EndpointPicker::EndpointPicker(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

EndpointPicker::~EndpointPicker() { Stop(absl::ZeroDuration()); }

int EndpointPicker::port() const { return impl_->port; }

void EndpointPicker::Stop(absl::Duration grace) {
  if (impl_->stopped.exchange(true)) return;
  impl_->stop.Notify();
  impl_->health.join();
  impl_->server->GetHealthCheckService()->Shutdown();  // every service NOT_SERVING
  // The ext_proc streams (each a request the gateway is still proxying) get `grace` to end;
  // health Watch streams never end by themselves and are cut with the rest after it.
  const absl::Time give_up = absl::Now() + grace;
  while (impl_->shared.open_streams.load() > 0 && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  impl_->server->Shutdown(std::chrono::system_clock::now());
  impl_->server->Wait();
}

}  // namespace kvserve::epp
