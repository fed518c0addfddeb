// The NCCL link between two workers' GPUs (kernels/cuda/nccl_peer_link.h): its two ends as
// threads and as processes, a peer that leaves mid-transfer, a transfer that never comes, and
// ids that are not ids. Needs two CUDA devices (NCCL refuses two ranks on one GPU): the emulated
// build has eight; a one-GPU machine skips it. Label: gpu.
#include "kernels/cuda/nccl_peer_link.h"

#include <cuda_runtime.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/nccl_communicator.h"
#include "tests/testing/status_matchers.h"

namespace kvserve::kernels {
namespace {

// Sizes of the ranges each test moves: odd sizes, and more than a socket's buffer.
const std::vector<size_t> kSizes = {7, 1000, size_t{3} << 20};

std::vector<uint8_t> Pattern(size_t bytes, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> out(bytes);
  for (uint8_t& b : out) b = static_cast<uint8_t>(rng());
  return out;
}

// Device buffers of kSizes on `device`, filled with Pattern(size, i) when `fill`.
struct Buffers {
  Buffers(int device, bool fill) {
    EXPECT_EQ(cudaSetDevice(device), cudaSuccess);
    for (size_t i = 0; i < kSizes.size(); ++i) {
      void* p = nullptr;
      EXPECT_EQ(cudaMalloc(&p, kSizes[i]), cudaSuccess);
      if (fill) {
        const std::vector<uint8_t> host = Pattern(kSizes[i], i);
        EXPECT_EQ(cudaMemcpy(p, host.data(), kSizes[i], cudaMemcpyHostToDevice), cudaSuccess);
      }
      ranges.push_back({p, kSizes[i]});
    }
  }
  ~Buffers() {
    for (const ByteRange& r : ranges) cudaFree(const_cast<void*>(r.data));
  }
  // Whether buffer i holds Pattern(size, i), for every i.
  bool HoldPatterns() const {
    for (size_t i = 0; i < ranges.size(); ++i) {
      std::vector<uint8_t> host(ranges[i].bytes);
      cudaMemcpy(host.data(), ranges[i].data, host.size(), cudaMemcpyDeviceToHost);
      if (host != Pattern(ranges[i].bytes, i)) return false;
    }
    return true;
  }
  std::vector<ByteRange> ranges;
};

bool TwoDevices() { return CudaDeviceCount() >= 2; }

// A child process that joins link `id` as rank 1 on device 1 and exits with what `then` returns
// (2 when it could not join), as a decode worker's end would.
pid_t ForkPeer(const std::string& id, const std::function<int(PeerLink&)>& then) {
  const pid_t child = fork();
  if (child != 0) return child;
  absl::StatusOr<std::unique_ptr<PeerLink>> link = JoinNcclPeerLink(id, 1, 1, absl::Seconds(30));
  _exit(link.ok() ? then(**link) : 2);
}

// The child's exit status (-1 when it did not exit).
int ExitStatus(pid_t child) {
  int status = 0;
  if (waitpid(child, &status, 0) != child || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

TEST(NcclPeerLinkTest, MovesRangesBetweenThreads) {
  if (!TwoDevices()) GTEST_SKIP() << "needs two CUDA devices";
  ASSERT_OK_AND_ASSIGN(std::string id, NewNcclPeerId());
  absl::Status sent;
  std::thread sender([&] {
    absl::StatusOr<std::unique_ptr<PeerLink>> link = JoinNcclPeerLink(id, 0, 0, absl::Seconds(30));
    if (!link.ok()) {
      sent = link.status();
      return;
    }
    Buffers out(0, /*fill=*/true);
    sent = (*link)->Send(out.ranges);
  });
  ASSERT_OK_AND_ASSIGN(auto link, JoinNcclPeerLink(id, 1, 1, absl::Seconds(30)));
  Buffers in(1, /*fill=*/false);
  EXPECT_OK(link->Receive(in.ranges));
  sender.join();
  EXPECT_OK(sent);
  EXPECT_TRUE(in.HoldPatterns());
}

// StartSend returns at once and PollSend says false while the peer has not taken the bytes
// (3 MiB do not fit in the emulator's socket buffer), then true; a second send queues behind
// the first, a receive is refused meanwhile, and the bytes of both arrive whole.
TEST(NcclPeerLinkTest, ASendRunsWhileItsCallerGoesOn) {
  if (!TwoDevices()) GTEST_SKIP() << "needs two CUDA devices";
  ASSERT_OK_AND_ASSIGN(std::string id, NewNcclPeerId());
  absl::Notification receive;
  bool whole = false;
  std::thread receiver([&] {
    absl::StatusOr<std::unique_ptr<PeerLink>> link = JoinNcclPeerLink(id, 1, 1, absl::Seconds(30));
    if (!link.ok()) return;
    Buffers first(1, /*fill=*/false), second(1, /*fill=*/false);
    receive.WaitForNotification();
    whole = (*link)->Receive(first.ranges).ok() && (*link)->Receive(second.ranges).ok() &&
            first.HoldPatterns() && second.HoldPatterns();
  });
  ASSERT_OK_AND_ASSIGN(auto link, JoinNcclPeerLink(id, 0, 0, absl::Seconds(30)));
  Buffers out(0, /*fill=*/true);
  ASSERT_OK(link->StartSend(out.ranges));
  ASSERT_OK(link->StartSend(out.ranges));
  EXPECT_TRUE(absl::IsFailedPrecondition(link->StartReceive(out.ranges)))
      << "one direction at a time";
  absl::SleepFor(absl::Milliseconds(100));
  ASSERT_OK_AND_ASSIGN(bool done, link->PollSend());
  EXPECT_FALSE(done) << "nobody has taken the bytes yet";
  receive.Notify();
  for (int i = 0; i < 30000 && !done; ++i) {
    ASSERT_OK_AND_ASSIGN(done, link->PollSend());
    if (!done) absl::SleepFor(absl::Milliseconds(1));
  }
  receiver.join();
  EXPECT_TRUE(done);
  EXPECT_TRUE(whole);
}

// Layer streaming's two ends: each send follows a copy queued on a backend's stream (as a
// layer's KV follows the compute that writes it) without the sender waiting for it, and the
// receiver queues its receives and polls, waiting for nothing. PollReceive is false until the
// sender sends; each range arrives as the copy left it.
TEST(NcclPeerLinkTest, SendsFollowTheBackendAndReceivesArePolled) {
  if (!TwoDevices()) GTEST_SKIP() << "needs two CUDA devices";
  ASSERT_OK_AND_ASSIGN(std::string id, NewNcclPeerId());
  absl::Notification send;
  absl::Status sent;
  std::thread sender([&] {
    absl::StatusOr<std::unique_ptr<PeerLink>> link = JoinNcclPeerLink(id, 0, 0, absl::Seconds(30));
    absl::StatusOr<std::unique_ptr<Backend>> backend = CreateCudaBackend({.device = 0});
    if (!link.ok() || !backend.ok()) {
      sent = link.ok() ? backend.status() : link.status();
      return;
    }
    Buffers source(0, /*fill=*/true), out(0, /*fill=*/false);
    send.WaitForNotification();
    for (size_t i = 0; i < out.ranges.size() && sent.ok(); ++i) {
      (*backend)->Copy(const_cast<void*>(out.ranges[i].data), source.ranges[i].data,
                       out.ranges[i].bytes);
      sent = (*link)->StartSend({out.ranges[i]}, backend->get());
    }
    for (int i = 0; i < 30000 && sent.ok(); ++i) {
      absl::StatusOr<bool> done = (*link)->PollSend();
      sent = done.status();
      if (done.ok() && *done) break;
      absl::SleepFor(absl::Milliseconds(1));
    }
  });
  ASSERT_OK_AND_ASSIGN(auto link, JoinNcclPeerLink(id, 1, 1, absl::Seconds(30)));
  Buffers in(1, /*fill=*/false);
  for (const ByteRange& r : in.ranges) ASSERT_OK(link->StartReceive({r}));
  absl::SleepFor(absl::Milliseconds(100));
  ASSERT_OK_AND_ASSIGN(bool done, link->PollReceive());
  EXPECT_FALSE(done) << "nothing was sent yet";
  send.Notify();
  for (int i = 0; i < 30000 && !done; ++i) {
    ASSERT_OK_AND_ASSIGN(done, link->PollReceive());
    if (!done) absl::SleepFor(absl::Milliseconds(1));
  }
  sender.join();
  EXPECT_OK(sent);
  EXPECT_TRUE(done);
  EXPECT_TRUE(in.HoldPatterns());
}

// The decode worker's end in another process, as in a deployment: it exits 0 when the bytes
// arrived whole, 1 when not, 2 when it could not join.
TEST(NcclPeerLinkTest, MovesRangesBetweenProcesses) {
  if (!TwoDevices()) GTEST_SKIP() << "needs two CUDA devices";
  ASSERT_OK_AND_ASSIGN(std::string id, NewNcclPeerId());
  const pid_t child = ForkPeer(id, [](PeerLink& link) {
    Buffers in(1, /*fill=*/false);
    return link.Receive(in.ranges).ok() && in.HoldPatterns() ? 0 : 1;
  });
  ASSERT_GE(child, 0);
  ASSERT_OK_AND_ASSIGN(auto link, JoinNcclPeerLink(id, 0, 0, absl::Seconds(30)));
  Buffers out(0, /*fill=*/true);
  EXPECT_OK(link->Send(out.ranges));
  EXPECT_EQ(ExitStatus(child), 0);
}

// The receiver's process dies after joining: the send ends with Unavailable, not a hang, and
// the link stays dead.
TEST(NcclPeerLinkTest, APeerThatDiesEndsTheTransfer) {
  if (!TwoDevices()) GTEST_SKIP() << "needs two CUDA devices";
  ASSERT_OK_AND_ASSIGN(std::string id, NewNcclPeerId());
  const pid_t child = ForkPeer(id, [](PeerLink&) { return 0; });  // gone without a word
  ASSERT_GE(child, 0);
  ASSERT_OK_AND_ASSIGN(auto link, JoinNcclPeerLink(id, 0, 0, absl::Seconds(30)));
  ASSERT_EQ(ExitStatus(child), 0);
  Buffers out(0, /*fill=*/true);
  const absl::Status s = link->Send(out.ranges);
  EXPECT_TRUE(absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s)) << s;
  EXPECT_EQ(link->Send(out.ranges), s);
}

// Nothing is ever sent: the receive gives up at the link's timeout.
TEST(NcclPeerLinkTest, AReceiveThatNeverComesTimesOut) {
  if (!TwoDevices()) GTEST_SKIP() << "needs two CUDA devices";
  ASSERT_OK_AND_ASSIGN(std::string id, NewNcclPeerId());
  absl::Notification done;
  std::thread quiet([&] {
    absl::StatusOr<std::unique_ptr<PeerLink>> link =
        JoinNcclPeerLink(id, 0, 0, absl::Milliseconds(300));
    done.WaitForNotification();
  });
  ASSERT_OK_AND_ASSIGN(auto link, JoinNcclPeerLink(id, 1, 1, absl::Milliseconds(300)));
  Buffers in(1, /*fill=*/false);
  const absl::Status s = link->Receive(in.ranges);
  done.Notify();
  quiet.join();
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
}

TEST(NcclPeerLinkTest, RefusesWhatIsNotALink) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  EXPECT_TRUE(
      absl::IsInvalidArgument(JoinNcclPeerLink("not an id", 0, 0, absl::Seconds(1)).status()));
  ASSERT_OK_AND_ASSIGN(std::string id, NewNcclPeerId());
  EXPECT_TRUE(absl::IsInvalidArgument(JoinNcclPeerLink(id, 2, 0, absl::Seconds(1)).status()));
}

}  // namespace
}  // namespace kvserve::kernels
