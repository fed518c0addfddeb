// kvserve-worker's own OpenAI front: the front end over a LocalCore.
#include "worker/openai/openai_front.h"

#include <chrono>
#include <thread>
#include <utility>

#include "common/status_macros.h"

namespace kvserve::worker {

absl::StatusOr<std::unique_ptr<OpenAiFront>> OpenAiFront::Start(
    const OpenAiFrontOptions& options, const frontend::FrontOptions& front) {
  std::unique_ptr<OpenAiFront> f(new OpenAiFront());
  ASSIGN_OR_RETURN(f->tokenizer_, tokenizer::Tokenizer::FromDirectory(options.model_dir));
  LocalCoreOptions core = options.core;
  core.metrics = &f->metrics_;
  f->core_ = std::make_unique<LocalCore>(core);
  f->core_->Start();
  ASSIGN_OR_RETURN(f->front_, frontend::HttpFront::Start(front, f->tokenizer_.get(), f->core_.get(),
                                                         &f->metrics_));
  return f;
}

OpenAiFront::~OpenAiFront() { Stop(absl::ZeroDuration()); }

void OpenAiFront::Stop(absl::Duration grace) {
  if (front_ == nullptr) return;
  front_->StopAccepting();
  const absl::Time give_up = absl::Now() + grace;
  while (metrics_.open_connections() > 0 && absl::Now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  front_->Stop();
  core_.reset();  // its jobs hold the front's connections
  front_.reset();
}

}  // namespace kvserve::worker
