// NCCL collectives on the GPU with one rank (NCCL refuses two ranks on one GPU; the emulated
// build, with eight emulated devices, runs two); skipped without enough CUDA devices. Label:
// gpu.
#include "kernels/cuda/nccl_communicator.h"

#include <cuda_runtime.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace kvserve::kernels {
namespace {

TEST(NcclCommunicatorTest, SingleRankCollectives) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  ASSERT_OK_AND_ASSIGN(auto comms, CreateNcclGroup({0}, absl::Seconds(30)));
  Communicator& c = *comms[0];
  EXPECT_EQ(c.size(), 1);
  std::vector<float> host = {1, 2, 3, 4};
  float* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, 8 * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dev, host.data(), 4 * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_OK(c.AllReduceSum(dev, 4));
  ASSERT_OK(c.AllGather(dev, 4, dev + 4));
  ASSERT_OK(c.Broadcast(dev, 4, 0));
  ASSERT_OK(c.Barrier());
  std::vector<float> back(8);
  ASSERT_EQ(cudaMemcpy(back.data(), dev, 8 * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, (std::vector<float>{1, 2, 3, 4, 1, 2, 3, 4}));
  cudaFree(dev);
}

// One rank's side of a test, on the thread that makes it: its device made current, a
// non-blocking stream, `count` floats (dev) and `count × ranks` for a gather (all).
struct RankBuffers {
  RankBuffers(int rank, int count, int ranks) {
    EXPECT_EQ(cudaSetDevice(rank), cudaSuccess);
    EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&dev, count * sizeof(float)), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&all, size_t{1} * count * ranks * sizeof(float)), cudaSuccess);
  }
  ~RankBuffers() {
    cudaFree(dev);
    cudaFree(all);
    cudaStreamDestroy(stream);
  }
  cudaStream_t stream = nullptr;
  float* dev = nullptr;
  float* all = nullptr;
};

// The stream-ordered collectives the model uses (all-reduce between layers, all-gather of the
// logits): each rank writes its values, enqueues three all-reduces and an all-gather and copies
// the result back, all on one stream and without waiting; the results must be there once that
// stream is synchronized. (Emulated, a collective that did not wait for the work before it
// would read poisoned memory.)
void StreamOrderedCollectives(int ranks) {
  if (CudaDeviceCount() < ranks) GTEST_SKIP() << "fewer CUDA devices than " << ranks;
  std::vector<int> devices;
  for (int r = 0; r < ranks; ++r) devices.push_back(r);
  ASSERT_OK_AND_ASSIGN(auto comms, CreateNcclGroup(devices, absl::Seconds(30)));
  ASSERT_TRUE(comms[0]->stream_ordered());
  constexpr int kCount = 1000;
  std::vector<std::vector<float>> results(ranks, std::vector<float>(kCount * ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      const RankBuffers b(r, kCount, ranks);
      cudaStream_t stream = b.stream;
      float *dev = b.dev, *all = b.all;
      std::vector<float> mine(kCount);
      for (int i = 0; i < kCount; ++i) mine[i] = static_cast<float>((r + 1) * i);
      ASSERT_EQ(
          cudaMemcpyAsync(dev, mine.data(), kCount * sizeof(float), cudaMemcpyHostToDevice, stream),
          cudaSuccess);
      for (int round = 0; round < 3; ++round) {
        ASSERT_OK(comms[r]->EnqueueAllReduceSum(dev, kCount, stream));
      }
      ASSERT_OK(comms[r]->EnqueueAllGather(dev, kCount, all, stream));
      ASSERT_EQ(cudaMemcpyAsync(results[r].data(), all, kCount * ranks * sizeof(float),
                                cudaMemcpyDeviceToHost, stream),
                cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    });
  }
  for (std::thread& t : threads) t.join();
  // Three rounds: sum over ranks, then times ranks twice; gathered once per rank.
  const int factor = ranks * (ranks + 1) / 2 * ranks * ranks;
  for (int r = 0; r < ranks; ++r) {
    for (int i = 0; i < kCount * ranks; ++i) {
      ASSERT_EQ(results[r][i], static_cast<float>(factor * (i % kCount)))
          << "rank " << r << " element " << i;
    }
  }
}

TEST(NcclCommunicatorTest, StreamOrderedCollectivesOneRank) { StreamOrderedCollectives(1); }
TEST(NcclCommunicatorTest, StreamOrderedCollectivesTwoRanks) { StreamOrderedCollectives(2); }

// Stream-ordered collectives recorded in a CUDA graph (stream capture, as the decode graphs do
// with tensor parallelism): recording runs nothing, and each replay sums and gathers what the
// inputs hold then; EnqueueWatch hands the replay to the watchdog. Two replays, the second on
// doubled inputs.
void CollectivesInAGraph(int ranks) {
  if (CudaDeviceCount() < ranks) GTEST_SKIP() << "fewer CUDA devices than " << ranks;
  std::vector<int> devices;
  for (int r = 0; r < ranks; ++r) devices.push_back(r);
  ASSERT_OK_AND_ASSIGN(auto comms, CreateNcclGroup(devices, absl::Seconds(30)));
  constexpr int kCount = 1000;
  // Per rank: the gathered sums after recording (nothing ran: zeros) and after each replay.
  std::vector<std::vector<std::vector<float>>> results(ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      const RankBuffers b(r, kCount, ranks);
      cudaStream_t stream = b.stream;
      float *dev = b.dev, *all = b.all;
      ASSERT_EQ(cudaMemsetAsync(all, 0, kCount * ranks * sizeof(float), stream), cudaSuccess);
      std::vector<float> mine(kCount), back(kCount * ranks);
      auto download = [&] {
        ASSERT_EQ(cudaMemcpyAsync(back.data(), all, back.size() * sizeof(float),
                                  cudaMemcpyDeviceToHost, stream),
                  cudaSuccess);
        ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
        results[r].push_back(back);
      };
      ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
      ASSERT_OK(comms[r]->EnqueueAllReduceSum(dev, kCount, stream));
      ASSERT_OK(comms[r]->EnqueueAllGather(dev, kCount, all, stream));
      cudaGraph_t graph = nullptr;
      ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
      cudaGraphExec_t exec = nullptr;
      ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
      download();
      for (int replay = 1; replay <= 2; ++replay) {
        for (int i = 0; i < kCount; ++i) mine[i] = static_cast<float>(replay * (r + 1) * i);
        ASSERT_EQ(cudaMemcpyAsync(dev, mine.data(), kCount * sizeof(float), cudaMemcpyHostToDevice,
                                  stream),
                  cudaSuccess);
        ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
        ASSERT_OK(comms[r]->EnqueueWatch(stream));
        download();
      }
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < ranks; ++r) {
    ASSERT_EQ(results[r].size(), 3u) << "rank " << r;
    for (int replay = 0; replay <= 2; ++replay) {
      const int factor = replay * ranks * (ranks + 1) / 2;
      for (int i = 0; i < kCount * ranks; ++i) {
        ASSERT_EQ(results[r][replay][i], static_cast<float>(factor * (i % kCount)))
            << "rank " << r << " replay " << replay << " element " << i;
      }
    }
  }
}

TEST(NcclCommunicatorTest, CollectivesInAGraphOneRank) { CollectivesInAGraph(1); }
TEST(NcclCommunicatorTest, CollectivesInAGraphTwoRanks) { CollectivesInAGraph(2); }

// A stream-ordered all-reduce whose peer never joins: the watchdog aborts the communicator at
// the timeout, and the rank's next call says why instead of hanging. (Needs two devices: the
// emulated build. The stalled collective stays queued on a stream nothing waits for.)
// Calls `call` every 50 ms until it fails (the watchdog's error once it fired), for up to 10 s.
template <typename Call>
absl::Status FirstError(Call call) {
  const auto start = std::chrono::steady_clock::now();
  absl::Status s;
  while (s.ok() && std::chrono::steady_clock::now() - start < std::chrono::seconds(10)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    s = call();
  }
  return s;
}

TEST(NcclCommunicatorTest, StalledStreamOrderedAllReduceTimesOut) {
  if (CudaDeviceCount() < 2) GTEST_SKIP() << "fewer than two CUDA devices";
  ASSERT_OK_AND_ASSIGN(auto comms, CreateNcclGroup({0, 1}, absl::Milliseconds(200)));
  const RankBuffers b(0, 4, 2);
  ASSERT_OK(comms[0]->EnqueueAllReduceSum(b.dev, 4, b.stream));  // rank 1 never calls
  const absl::Status s =
      FirstError([&] { return comms[0]->EnqueueAllReduceSum(b.dev, 4, b.stream); });
  ASSERT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_EQ(comms[0]->Barrier().code(), absl::StatusCode::kDeadlineExceeded);
}

// The same stall inside a replayed graph: the watchdog bounds the replay handed to it by
// EnqueueWatch.
TEST(NcclCommunicatorTest, StalledGraphReplayTimesOut) {
  if (CudaDeviceCount() < 2) GTEST_SKIP() << "fewer than two CUDA devices";
  ASSERT_OK_AND_ASSIGN(auto comms, CreateNcclGroup({0, 1}, absl::Milliseconds(200)));
  const RankBuffers b(0, 4, 2);
  ASSERT_EQ(cudaStreamBeginCapture(b.stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  ASSERT_OK(comms[0]->EnqueueAllReduceSum(b.dev, 4, b.stream));
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(b.stream, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, b.stream), cudaSuccess);  // rank 1 never replays
  ASSERT_OK(comms[0]->EnqueueWatch(b.stream));
  const absl::Status s = FirstError([&] { return comms[0]->EnqueueWatch(b.stream); });
  ASSERT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("replayed graph"));
}

}  // namespace
}  // namespace kvserve::kernels
