// The emulated CUDA runtime's stream rules (tests/testing/cuda_emulator/streams.h), which the
// emulated build's tests rely on to expose missing synchronisation: queued work waits until
// something waits for it (a query does not wait), event waits order streams, copies to pageable
// memory complete before returning and copies from it read the source at the call; graph
// capture records work without running it, a replay reads memory as it is then, and what CUDA
// forbids while capturing aborts; a write past a buffer's end aborts when the buffer is freed.
// Emulated build only.
#include <cuda_runtime_api.h>

#include <vector>

#include "gtest/gtest.h"

namespace {

class EmulatedRuntimeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&device_), kBytes), cudaSuccess);
    ASSERT_EQ(cudaHostAlloc(reinterpret_cast<void**>(&pinned_), kBytes, cudaHostAllocMapped),
              cudaSuccess);
    for (cudaStream_t* s : {&a_, &b_}) {
      ASSERT_EQ(cudaStreamCreateWithFlags(s, cudaStreamNonBlocking), cudaSuccess);
    }
    ASSERT_EQ(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), cudaSuccess);
  }
  void TearDown() override {
    cudaEventDestroy(event_);
    cudaStreamDestroy(a_);
    cudaStreamDestroy(b_);
    cudaFreeHost(pinned_);
    cudaFree(device_);
  }

  static constexpr size_t kBytes = 64;
  unsigned char* device_ = nullptr;
  unsigned char* pinned_ = nullptr;
  cudaStream_t a_ = nullptr, b_ = nullptr;
  cudaEvent_t event_ = nullptr;
};

TEST_F(EmulatedRuntimeTest, QueuedWorkRunsWhenTheStreamIsSynchronized) {
  pinned_[0] = 0;
  ASSERT_EQ(cudaMemsetAsync(device_, 7, kBytes, a_), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(pinned_, device_, kBytes, cudaMemcpyDeviceToHost, a_), cudaSuccess);
  EXPECT_EQ(pinned_[0], 0) << "ran before anything waited for it";
  ASSERT_EQ(cudaStreamSynchronize(a_), cudaSuccess);
  EXPECT_EQ(pinned_[kBytes - 1], 7);
}

// A query looks without waiting (NCCL's watchdog polls its events from another thread).
TEST_F(EmulatedRuntimeTest, AnEventQueryDoesNotRunTheStream) {
  pinned_[0] = 0;
  ASSERT_EQ(cudaMemsetAsync(pinned_, 3, kBytes, a_), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(event_, a_), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(event_), cudaErrorNotReady);
  EXPECT_EQ(pinned_[0], 0);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "not-ready is not an error";
  ASSERT_EQ(cudaStreamSynchronize(a_), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(event_), cudaSuccess);
  EXPECT_EQ(pinned_[0], 3);
}

TEST_F(EmulatedRuntimeTest, AnEventWaitRunsTheOtherStreamUpToTheRecord) {
  ASSERT_EQ(cudaMemsetAsync(device_, 5, kBytes, a_), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(event_, a_), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(device_, 9, kBytes, a_), cudaSuccess);  // after the record
  ASSERT_EQ(cudaStreamWaitEvent(b_, event_, 0), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(pinned_, device_, kBytes, cudaMemcpyDeviceToHost, b_), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(event_, a_), cudaSuccess);  // a later record: the wait keeps the old
  ASSERT_EQ(cudaStreamSynchronize(b_), cudaSuccess);
  EXPECT_EQ(pinned_[0], 5);
  ASSERT_EQ(cudaEventSynchronize(event_), cudaSuccess);
  std::vector<unsigned char> back(kBytes);
  ASSERT_EQ(cudaMemcpy(back.data(), device_, kBytes, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back[0], 9);
}

TEST_F(EmulatedRuntimeTest, PageableCopiesCompleteOrStageAtTheCall) {
  std::vector<unsigned char> source(kBytes, 3), back(kBytes, 0);
  ASSERT_EQ(cudaMemcpyAsync(device_, source.data(), kBytes, cudaMemcpyHostToDevice, a_),
            cudaSuccess);
  source.assign(kBytes, 4);  // staged already: the copy keeps the 3s
  ASSERT_EQ(cudaMemcpyAsync(back.data(), device_, kBytes, cudaMemcpyDeviceToHost, a_), cudaSuccess);
  EXPECT_EQ(back[0], 3) << "a copy to pageable memory returns once done";
}

TEST_F(EmulatedRuntimeTest, CudaFreeSynchronizesTheDevice) {
  unsigned char* scratch = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&scratch), kBytes), cudaSuccess);
  pinned_[0] = 0;
  ASSERT_EQ(cudaMemsetAsync(device_, 6, kBytes, b_), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(pinned_, device_, kBytes, cudaMemcpyDeviceToHost, b_), cudaSuccess);
  ASSERT_EQ(cudaFree(scratch), cudaSuccess);
  EXPECT_EQ(pinned_[0], 6);
}

// Captured work does not run; each launch of the graph runs all of it, reading the memory as it
// is at the launch (as a GPU reads a kernel's inputs when it runs).
TEST_F(EmulatedRuntimeTest, ACapturedGraphRunsOnlyWhenLaunched) {
  pinned_[0] = 1;
  ASSERT_EQ(cudaStreamBeginCapture(a_, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  cudaStreamCaptureStatus status;
  ASSERT_EQ(cudaStreamIsCapturing(a_, &status), cudaSuccess);
  EXPECT_EQ(status, cudaStreamCaptureStatusActive);
  ASSERT_EQ(cudaMemcpyAsync(device_, pinned_, kBytes, cudaMemcpyHostToDevice, a_), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(pinned_ + 1, device_, 1, cudaMemcpyDeviceToHost, a_), cudaSuccess);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(a_, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(a_), cudaSuccess);
  EXPECT_NE(pinned_[1], 1) << "captured work ran at capture";

  for (unsigned char v : {5, 9}) {
    pinned_[0] = v;
    ASSERT_EQ(cudaGraphLaunch(exec, a_), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(a_), cudaSuccess);
    EXPECT_EQ(pinned_[1], v);
  }
  ASSERT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
}

TEST_F(EmulatedRuntimeTest, EndingACaptureThatDidNotBeginFails) {
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(a_, &graph), cudaErrorIllegalState);
  cudaGetLastError();
}

using EmulatedRuntimeDeathTest = EmulatedRuntimeTest;

TEST_F(EmulatedRuntimeDeathTest, WaitingForACapturingStreamAborts) {
  EXPECT_DEATH(
      {
        cudaStreamBeginCapture(a_, cudaStreamCaptureModeThreadLocal);
        cudaStreamSynchronize(a_);
      },
      "capturing a graph");
}

TEST_F(EmulatedRuntimeDeathTest, AllocatingWhileCapturingAborts) {
  EXPECT_DEATH(
      {
        cudaStreamBeginCapture(a_, cudaStreamCaptureModeThreadLocal);
        void* p = nullptr;
        cudaMalloc(&p, 16);
      },
      "cudaMalloc while this thread captures a graph");
}

TEST_F(EmulatedRuntimeDeathTest, PageableCopiesWhileCapturingAbort) {
  std::vector<unsigned char> pageable(kBytes);
  EXPECT_DEATH(
      {
        cudaStreamBeginCapture(a_, cudaStreamCaptureModeThreadLocal);
        cudaMemcpyAsync(device_, pageable.data(), kBytes, cudaMemcpyHostToDevice, a_);
      },
      "pageable memory on a stream that is capturing");
}

// A GPU would corrupt the next allocation, or fault: the emulation aborts when the buffer is
// freed, naming how far past its end the write went.
TEST_F(EmulatedRuntimeDeathTest, WritingPastADeviceBufferAbortsWhenItIsFreed) {
  EXPECT_DEATH(
      {
        cudaMemsetAsync(device_, 0, kBytes + 3, a_);
        cudaFree(device_);
      },
      "emulated device memory written past its end: byte 0 after the 64 bytes");
}

TEST_F(EmulatedRuntimeDeathTest, WritingPastAPinnedBufferAbortsWhenItIsFreed) {
  EXPECT_DEATH(
      {
        pinned_[kBytes + 200] = 0;
        cudaFreeHost(pinned_);
      },
      "emulated pinned host memory written past its end: byte 200 after the 64 bytes");
}

}  // namespace
