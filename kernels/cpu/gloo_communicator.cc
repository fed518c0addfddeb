#include "kernels/cpu/gloo_communicator.h"

#include <chrono>
#include <exception>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gloo/allgather.h"
#include "gloo/allreduce.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/common/error.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/hash_store.h"
#include "gloo/transport/tcp/device.h"

namespace kvserve::kernels {
namespace {

// Gloo reports failures (timeouts, lost peers) by throwing; collectives become Statuses here.
template <typename Fn>
absl::Status Guard(const char* what, Fn fn) {
  try {
    fn();
    return absl::OkStatus();
  } catch (const gloo::IoException& e) {
    const std::string msg = e.what();
    if (msg.find("Timed out") != std::string::npos || msg.find("timed out") != std::string::npos) {
      return absl::DeadlineExceededError(absl::StrCat("gloo ", what, ": ", msg));
    }
    return absl::UnavailableError(absl::StrCat("gloo ", what, ": ", msg));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("gloo ", what, ": ", e.what()));
  }
}

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(std::shared_ptr<gloo::rendezvous::Context> ctx,
                   std::chrono::milliseconds timeout)
      : ctx_(std::move(ctx)), timeout_(timeout) {}

  int rank() const override { return ctx_->rank; }
  int size() const override { return ctx_->size; }
  std::string_view name() const override { return "gloo"; }

  absl::Status AllReduceSum(float* data, size_t count) override {
    return Guard("all-reduce", [&] {
      gloo::AllreduceOptions opts(ctx_);
      opts.setInput(data, count);
      opts.setOutput(data, count);
      opts.setReduceFunction(
          static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
      opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::BCUBE);
      opts.setTag(tag_++);
      opts.setTimeout(timeout_);
      gloo::allreduce(opts);
    });
  }

  absl::Status AllGather(const float* in, size_t count, float* out) override {
    return Guard("all-gather", [&] {
      gloo::AllgatherOptions opts(ctx_);
      opts.setInput(const_cast<float*>(in), count);
      opts.setOutput(out, count * ctx_->size);
      opts.setTag(tag_++);
      opts.setTimeout(timeout_);
      gloo::allgather(opts);
    });
  }

  absl::Status Broadcast(float* data, size_t count, int root) override {
    return Guard("broadcast", [&] {
      gloo::BroadcastOptions opts(ctx_);
      if (ctx_->rank == root) opts.setInput(data, count);
      opts.setOutput(data, count);
      opts.setRoot(root);
      opts.setTag(tag_++);
      opts.setTimeout(timeout_);
      gloo::broadcast(opts);
    });
  }

  absl::Status Barrier() override {
    return Guard("barrier", [&] {
      gloo::BarrierOptions opts(ctx_);
      opts.setTag(tag_++);
      opts.setTimeout(timeout_);
      gloo::barrier(opts);
    });
  }

 private:
  std::shared_ptr<gloo::rendezvous::Context> ctx_;
  std::chrono::milliseconds timeout_;
  uint32_t tag_ = 0;
};

}  // namespace

absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> CreateGlooGroup(int size,
                                                                           absl::Duration timeout) {
  if (size < 1) return absl::InvalidArgumentError("a communicator group needs at least one rank");
  const auto ms = std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout));
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  std::vector<std::shared_ptr<gloo::rendezvous::Context>> contexts(size);
  std::vector<absl::Status> status(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      status[r] = Guard("rendezvous", [&] {
        auto device = gloo::transport::tcp::CreateDevice(attr);
        auto ctx = std::make_shared<gloo::rendezvous::Context>(r, size);
        ctx->setTimeout(ms);
        ctx->connectFullMesh(*store, device);
        contexts[r] = std::move(ctx);
      });
    });
  }
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : status) {
    if (!s.ok()) return absl::UnavailableError(s.message());
  }
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < size; ++r) out.push_back(std::make_unique<GlooCommunicator>(contexts[r], ms));
  return out;
}

}  // namespace kvserve::kernels
