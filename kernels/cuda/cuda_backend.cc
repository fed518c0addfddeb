#include "kernels/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/attention/paged_attention.h"
#include "kernels/cuda/device/cuda_check.h"
#include "kernels/cuda/device/device_scratch.h"
#include "kernels/cuda/op_times.h"
#include "kernels/cuda/ops/copy_blocks.h"
#include "kernels/cuda/ops/decode_gemv.h"
#include "kernels/cuda/ops/elementwise.h"
#include "kernels/cuda/ops/fingerprint.h"
#include "kernels/cuda/ops/kv_write.h"
#include "kernels/cuda/ops/logits_processing.h"
#include "kernels/cuda/ops/sampling.h"
#include "kernels/cuda/staged_uploads.h"

#define KVSERVE_CUBLAS_CHECK(call)                                        \
  do {                                                                    \
    const cublasStatus_t kvserve_cublas_status = (call);                  \
    CHECK_EQ(kvserve_cublas_status, CUBLAS_STATUS_SUCCESS)                \
        << #call << ": " << cublasGetStatusString(kvserve_cublas_status); \
  } while (0)

namespace kvserve::kernels::cuda {
namespace {

DevKvLayout MakeDevKvLayout(const KvFormat& f, int64_t block_size, int64_t head_dim) {
  DevKvLayout l;
  l.dtype = f.dtype;
  l.granularity = f.quantized() ? f.granularity : KvGranularity::kNone;
  l.group_size = f.group_size;
  while (l.group_size > 0 && (1 << l.group_shift) < l.group_size) ++l.group_shift;
  l.params = f.scale_params();
  l.row_bytes = f.RowBytes(static_cast<int>(head_dim));
  l.scale_entries = f.ScaleEntries(static_cast<int>(block_size), static_cast<int>(head_dim));
  return l;
}

}  // namespace

AttnArgs MakeAttnArgs(const PagedAttentionParams& p) {
  const KvCacheView& c = p.cache;
  AttnArgs a;
  a.q = p.q;
  a.q_stride = p.q_stride;
  a.out = p.out;
  a.out16 = p.out16;
  a.out16_bf16 = p.out16_type == DType::kBF16;
  a.k = c.k;
  a.v = c.v;
  a.k_scales = c.k_scales;
  a.v_scales = c.v_scales;
  a.k_layout = MakeDevKvLayout(c.k_format, c.block_size, c.head_dim);
  a.v_layout = MakeDevKvLayout(c.v_format, c.block_size, c.head_dim);
  a.query_start = p.query_start;
  a.query_len = p.query_len;
  a.context_len = p.context_len;
  a.block_tables = p.block_tables;
  a.max_blocks_per_seq = p.max_blocks_per_seq;
  a.num_seqs = static_cast<int>(p.num_seqs);
  a.num_heads = static_cast<int>(p.num_heads);
  a.num_kv_heads = static_cast<int>(c.num_kv_heads);
  a.head_dim = static_cast<int>(c.head_dim);
  a.block_size = static_cast<int>(c.block_size);
  a.max_query_len = static_cast<int>(p.max_query_len);
  a.max_context_len = static_cast<int>(p.max_context_len);
  a.scale = p.scale;
  return a;
}

}  // namespace kvserve::kernels::cuda

namespace kvserve::kernels {
namespace {

void CheckOut16Type(const uint16_t* out16, DType type) {
  CHECK(out16 == nullptr || type == DType::kBF16 || type == DType::kF16)
      << "out16_type must be fp16 or bf16, not " << DTypeName(type);
}

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const CudaBackendOptions& options) : options_(options) {}

  absl::Status Init() {
    if (cudaSetDevice(options_.device) != cudaSuccess) {
      cudaGetLastError();
      return absl::UnavailableError(
          absl::StrCat("CUDA device ", options_.device, " is not usable"));
    }
    KVSERVE_CUDA_CHECK(
        cudaDeviceGetAttribute(&num_sms_, cudaDevAttrMultiProcessorCount, options_.device));
    KVSERVE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    KVSERVE_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
    KVSERVE_CUDA_CHECK(cudaEventCreateWithFlags(&compute_done_, cudaEventDisableTiming));
    for (SegmentBuffer& b : segment_buffers_) {
      KVSERVE_CUDA_CHECK(cudaEventCreateWithFlags(&b.done, cudaEventDisableTiming));
    }
    uploads_.Init();
    for (cudaEvent_t& e : download_done_) {
      KVSERVE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    }
    if (cublasCreate(&cublas_) != CUBLAS_STATUS_SUCCESS) {
      return absl::UnavailableError("cuBLAS could not initialize");
    }
    KVSERVE_CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
    if (options_.attention_pipelined || options_.decode_gemv_max_rows > 0) {
      KVSERVE_CUDA_CHECK(cudaDeviceGetAttribute(
          &max_shared_optin_, cudaDevAttrMaxSharedMemoryPerBlockOptin, options_.device));
    }
    if (options_.attention_pipelined) cuda::PreparePipelinedAttention(max_shared_optin_);
    if (options_.decode_gemv_max_rows > 0) {
      decode_gemv_row_bytes_ = cuda::PrepareDecodeGemv(max_shared_optin_);
    }
    return absl::OkStatus();
  }

  ~CudaBackend() override {
    cudaSetDevice(options_.device);
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    if (copy_stream_ != nullptr) cudaStreamSynchronize(copy_stream_);
    DropGraphs();
    uploads_.Release();
    op_times_.Release();
    for (cudaEvent_t e : download_done_) {
      if (e != nullptr) cudaEventDestroy(e);
    }
    attention_workspace_.Release();
    rounded_x_.Release();
    split_counters_.Release();
    fingerprint_sums_.Release();
    for (SegmentBuffer& b : segment_buffers_) {
      if (b.segments != nullptr) cudaFreeHost(b.segments);
      if (b.done != nullptr) cudaEventDestroy(b.done);
    }
    if (cublas_ != nullptr) cublasDestroy(cublas_);
    if (cublas_workspace_ != nullptr) cudaFree(cublas_workspace_);
    if (compute_done_ != nullptr) cudaEventDestroy(compute_done_);
    for (cudaEvent_t e : layer_events_) cudaEventDestroy(e);
    for (cudaStream_t s : {stream_, copy_stream_}) {
      if (s != nullptr) cudaStreamDestroy(s);
    }
  }

  std::string_view name() const override { return "cuda"; }

  // Ranks of one process share threads (the engine thread creates every rank's backend): each
  // op makes its own device current first.
  void Current() const { KVSERVE_CUDA_CHECK(cudaSetDevice(options_.device)); }

  // A cache (one layer of a pool, named by its K array) whose next use waits for `done`, just
  // recorded: one entry per cache, holding the latest event, which (the copy stream being in
  // order) covers every earlier copy too; so the list stays bounded though host-pool entries
  // are never awaited by compute.
  void AddPending(const uint8_t* cache, cudaEvent_t done) {
    for (PendingCopy& c : pending_) {
      if (c.cache == cache) {
        c.done = done;
        return;
      }
    }
    pending_.push_back({cache, done});
  }

  // Makes the compute stream wait for the block copies that touch the cache `c` (one layer of
  // a pool, named by its K array), once.
  void AwaitCopies(const KvCacheView& c) {
    for (size_t i = 0; i < pending_.size();) {
      if (pending_[i].cache == c.k) {
        KVSERVE_CUDA_CHECK(cudaStreamWaitEvent(stream_, pending_[i].done, 0));
        pending_[i] = pending_.back();
        pending_.pop_back();
      } else {
        ++i;
      }
    }
  }

  // Makes the compute stream wait for every block copy issued so far.
  void AwaitAllCopies() {
    for (const PendingCopy& c : pending_) {
      KVSERVE_CUDA_CHECK(cudaStreamWaitEvent(stream_, c.done, 0));
    }
    pending_.clear();
  }

  // Ops that wait for the device or move host memory cannot be recorded into a graph.
  void NotRecording(const char* op) const {
    CHECK(!recording_) << op << " while recording a graph (it would wait for the device)";
  }

  // The scratch buffer `s`, at least `bytes` long. Growing it keeps the old one while there
  // are recorded graphs, which may read it: they stay valid, and the eager ops use the new one.
  void* Scratch(cuda::DeviceScratch& s, size_t bytes) {
    bool grew = false;
    void* p = s.Get(bytes, stream_, &grew, graphs_.empty() ? nullptr : &kept_scratch_);
    CHECK(!grew || !recording_) << "an op recorded into a graph needs more scratch memory than "
                                   "when it last ran: run the same ops once before recording them";
    return p;
  }

  bool SupportsGraphs() const override { return true; }

  // ResourceExhausted for a failed allocation of device memory `what` is for (the error is not
  // sticky: the device goes on); any other error is a bug, and aborts.
  absl::Status OutOfMemory(cudaError_t e, const std::string& what) const {
    CHECK_EQ(e, cudaErrorMemoryAllocation) << what << ": " << cudaGetErrorString(e);
    (void)cudaGetLastError();  // clears it
    size_t free = 0, total = 0;
    KVSERVE_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    return absl::ResourceExhaustedError(absl::StrCat("out of memory on GPU ", options_.device, " ",
                                                     what, " (", free >> 20, " MiB free of ",
                                                     total >> 20, " MiB)"));
  }

  absl::Status BeginGraph() override {
    Current();
    NotRecording("BeginGraph");
    if (cublas_workspace_ == nullptr) {
      // From the first graph on, cuBLAS works in a fixed workspace of its own, so that
      // recording a GEMM allocates nothing (set after the stream, which resets it).
      if (const cudaError_t e = cudaMalloc(&cublas_workspace_, kCublasWorkspaceBytes);
          e != cudaSuccess) {
        cublas_workspace_ = nullptr;
        return OutOfMemory(e, absl::StrCat("for cuBLAS's graph workspace (",
                                           kCublasWorkspaceBytes >> 20, " MiB)"));
      }
      KVSERVE_CUBLAS_CHECK(cublasSetWorkspace(cublas_, cublas_workspace_, kCublasWorkspaceBytes));
    }
    AwaitAllCopies();
    KVSERVE_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    recording_ = true;
    return absl::OkStatus();
  }

  absl::StatusOr<int64_t> EndGraph() override {
    Current();
    CHECK(recording_) << "EndGraph without BeginGraph";
    recording_ = false;
    cudaGraph_t graph = nullptr;
    KVSERVE_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
    cudaGraphExec_t exec = nullptr;
    const cudaError_t instantiated = cudaGraphInstantiate(&exec, graph, 0);
    KVSERVE_CUDA_CHECK(cudaGraphDestroy(graph));
    if (instantiated != cudaSuccess) {
      return OutOfMemory(instantiated, "for an instantiated graph");
    }
    const int64_t id = next_graph_++;
    graphs_[id] = exec;
    return id;
  }

  bool ReplayGraph(int64_t graph) override {
    Current();
    NotRecording("ReplayGraph");
    auto it = graphs_.find(graph);
    if (it == graphs_.end()) return false;
    AwaitAllCopies();
    const cuda::OpTimes::Scope timed(op_times_, "graph", stream_, recording_);
    KVSERVE_CUDA_CHECK(cudaGraphLaunch(it->second, stream_));
    return true;
  }

  void DropGraphs() override {
    if (graphs_.empty()) return;
    Current();
    // A graph may still run: cudaGraphExecDestroy is safe then (its launches complete).
    for (const auto& [id, exec] : graphs_) KVSERVE_CUDA_CHECK(cudaGraphExecDestroy(exec));
    graphs_.clear();
    // After the replays queued so far, which may read them.
    for (const auto& [p, bytes] : kept_scratch_) KVSERVE_CUDA_CHECK(cudaFreeAsync(p, stream_));
    kept_scratch_.clear();
  }

  void EnableOpTiming(bool on) override { op_times_.Enable(on); }
  std::map<std::string, OpTime> TakeOpTimes() override {
    Current();
    return op_times_.Take();
  }

  size_t ScratchBytes() const override {
    size_t bytes = attention_workspace_.bytes() + rounded_x_.bytes() + fingerprint_sums_.bytes() +
                   split_counters_.bytes();
    for (const auto& kept : kept_scratch_) bytes += kept.second;
    return bytes;
  }

  void* Allocate(size_t bytes) override {
    Current();
    NotRecording("Allocate");
    void* p = nullptr;
    KVSERVE_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 1)));
    KVSERVE_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream_));
    KVSERVE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return p;
  }
  void Free(void* p) override {
    Current();
    NotRecording("Free");
    Synchronize();
    KVSERVE_CUDA_CHECK(cudaFree(p));
  }
  void* AllocateHost(size_t bytes) override {
    Current();
    NotRecording("AllocateHost");
    void* p = nullptr;
    KVSERVE_CUDA_CHECK(cudaHostAlloc(&p, std::max<size_t>(bytes, 1), cudaHostAllocMapped));
    std::memset(p, 0, bytes);
    return p;
  }
  void FreeHost(void* p) override {
    Current();
    NotRecording("FreeHost");
    Synchronize();
    KVSERVE_CUDA_CHECK(cudaFreeHost(p));
  }
  void Upload(void* dst, const void* src, size_t bytes) override {
    Current();
    NotRecording("Upload");
    uploads_.Upload(dst, src, bytes, stream_);  // returns at once (staged in pinned memory)
  }
  void Download(void* dst, const void* src, size_t bytes) override {
    Current();
    NotRecording("Download");
    if (bytes == 0) return;
    KVSERVE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
    KVSERVE_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  int64_t StartDownload(void* dst, const void* src, size_t bytes) override {
    Current();
    NotRecording("StartDownload");
    const int64_t ticket = next_download_++;
    if (bytes > 0) {
      KVSERVE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
    }
    KVSERVE_CUDA_CHECK(cudaEventRecord(download_done_[ticket % download_done_.size()], stream_));
    return ticket;
  }
  void WaitDownload(int64_t ticket) override {
    Current();
    CHECK(ticket < next_download_ &&
          ticket + static_cast<int64_t>(download_done_.size()) >= next_download_)
        << "WaitDownload: ticket " << ticket << " is not among the last " << download_done_.size()
        << " of " << next_download_;
    KVSERVE_CUDA_CHECK(cudaEventSynchronize(download_done_[ticket % download_done_.size()]));
  }
  void GatherTokens(const GatherTokensParams& p) override {
    Current();
    const cuda::OpTimes::Scope timed(op_times_, "gather_tokens", stream_, recording_);
    cuda::LaunchGatherTokens(p.dst, p.src, p.rows, p.from, p.n, stream_);
  }

  void Copy(void* dst, const void* src, size_t bytes) override {
    Current();
    if (bytes == 0) return;
    KVSERVE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
  }

  cudaStream_t stream() const { return stream_; }
  void* OpStream() override { return stream_; }

  void Synchronize() override {
    Current();
    NotRecording("Synchronize");
    KVSERVE_CUDA_CHECK(cudaStreamSynchronize(copy_stream_));
    KVSERVE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    pending_.clear();  // every copy is done
  }

  void Gemm(const GemmParams& p) override {
    Current();
    const cuda::OpTimes::Scope timed(op_times_, "gemm", stream_, recording_);
    if (p.m == 0 || p.n == 0) return;
    const float alpha = 1.0f, beta = 0.0f;
    const int m = static_cast<int>(p.m), n = static_cast<int>(p.n), k = static_cast<int>(p.k);
    // Row-major y = x · wᵀ is column-major yᵀ = w · xᵀ, with w seen as [k, n] and transposed.
    CHECK(p.x16 == nullptr || p.w_type != DType::kF32) << "Gemm: x16 needs 16-bit weights";
    if (p.w_type == DType::kF32) {
      KVSERVE_CUBLAS_CHECK(cublasSgemm(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha,
                                       static_cast<const float*>(p.w), k, p.x, k, &beta, p.y, n));
    } else {
      CHECK(p.w_type == DType::kF16 || p.w_type == DType::kBF16)
          << "Gemm: unsupported weight type " << DTypeName(p.w_type);
      const bool bf16 = p.w_type == DType::kBF16;
      const uint16_t* x16 = p.x16;
      if (x16 == nullptr) {
        auto* rounded = static_cast<uint16_t*>(Scratch(rounded_x_, sizeof(uint16_t) * p.m * p.k));
        cuda::LaunchRoundTo16(p.x, rounded, p.m * p.k, bf16, stream_);
        x16 = rounded;
      }
      const cudaDataType_t t = bf16 ? CUDA_R_16BF : CUDA_R_16F;
      KVSERVE_CUBLAS_CHECK(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, p.w, t,
                                        k, x16, t, k, &beta, p.y, CUDA_R_32F, n, CUBLAS_COMPUTE_32F,
                                        CUBLAS_GEMM_DEFAULT));
    }
    if (p.bias != nullptr) cuda::LaunchAddBias(p.y, p.bias, p.m, p.n, stream_);
  }

  int64_t DecodeGemvRows(int64_t k) const override {
    if (options_.decode_gemv_max_rows <= 0 || k <= 0 || k % 8 != 0) return 0;
    return std::min<int64_t>({options_.decode_gemv_max_rows, cuda::kDecodeGemvMaxRows,
                              decode_gemv_row_bytes_ / (2 * k)});
  }

  void DecodeGemv(const DecodeGemvParams& p) override {
    Current();
    const cuda::OpTimes::Scope timed(op_times_, "gemv", stream_, recording_);
    CHECK(p.w_type == DType::kF16 || p.w_type == DType::kBF16)
        << "DecodeGemv: weights of type " << DTypeName(p.w_type);
    CHECK(p.k % 8 == 0) << "DecodeGemv: k " << p.k << " is not a multiple of 8";
    CHECK_LE(p.m, p.norm.weight != nullptr ? DecodeGemvRows(p.k) : cuda::kDecodeGemvMaxRows)
        << "DecodeGemv: rows";
    CHECK(p.silu_mul ? p.out16 != nullptr : p.y != nullptr) << "DecodeGemv: no output";
    const DecodeGemvParams::Norm& nm = p.norm;
    cuda::LaunchDecodeGemv(
        {p.x16, nm.x, nm.residual_in, nm.residual_out, nm.weight, nm.eps, p.w,
         p.w_type == DType::kBF16, p.bias, p.y, p.silu_mul, p.out16, p.m, p.n, p.k},
        num_sms_, stream_);
  }

  void Embedding(const EmbeddingParams& p) override {
    Current();
    const cuda::OpTimes::Scope timed(op_times_, "embedding", stream_, recording_);
    CHECK(p.table_type == DType::kF32 || p.table_type == DType::kF16 ||
          p.table_type == DType::kBF16)
        << "embedding table type " << DTypeName(p.table_type);
    cuda::LaunchEmbedding(p.ids, p.table, p.table_type == DType::kF32 ? 32 : 16,
                          p.table_type == DType::kBF16, p.out, p.num_tokens, p.hidden, stream_);
  }

  void RmsNorm(const RmsNormParams& p) override {
    Current();
    const cuda::OpTimes::Scope timed(op_times_, "rms_norm", stream_, recording_);
    CHECK(p.group_rows == 0 || p.residual == nullptr) << "RmsNorm: groups take no residual";
    CHECK(p.out16 == nullptr || p.group_rows == 0) << "RmsNorm: out16 takes no groups";
    CheckOut16Type(p.out16, p.out16_type);
    cuda::LaunchRmsNorm(p.x, p.residual, p.weight, p.out, p.out16, p.out16_type == DType::kBF16,
                        p.rows, p.hidden, p.eps, p.group_rows, p.group_stride, stream_);
  }

  void Rope(const RopeParams& p) override {
    Current();
    const cuda::OpTimes::Scope timed(op_times_, "rope", stream_, recording_);
    cuda::LaunchRope(p.x, p.positions, p.inv_freq, p.num_tokens, p.num_heads, p.head_dim,
                     p.row_stride, stream_);
  }

  void SiluMul(const SiluMulParams& p) override {
    Current();
    const cuda::OpTimes::Scope timed(op_times_, "silu_mul", stream_, recording_);
    CheckOut16Type(p.out16, p.out16_type);
    cuda::LaunchSiluMul(p.gate_up, p.out, p.out16, p.out16_type == DType::kBF16, p.num_tokens,
                        p.inter, stream_);
  }

  void WriteKv(const WriteKvParams& p) override {
    Current();
    const cuda::OpTimes::Scope timed(op_times_, "write_kv", stream_, recording_);
    AwaitCopies(p.cache);
    const KvCacheView& c = p.cache;
    cuda::KvWriteArgs a;
    a.k = p.k;
    a.v = p.v;
    a.row_stride = p.row_stride;
    a.slot_mapping = p.slot_mapping;
    a.num_tokens = p.num_tokens;
    a.k_cache = c.k;
    a.v_cache = c.v;
    a.k_scales = c.k_scales;
    a.v_scales = c.v_scales;
    a.k_layout = cuda::MakeDevKvLayout(c.k_format, c.block_size, c.head_dim);
    a.v_layout = cuda::MakeDevKvLayout(c.v_format, c.block_size, c.head_dim);
    a.num_kv_heads = c.num_kv_heads;
    a.block_size = c.block_size;
    a.head_dim = c.head_dim;
    if (p.rope.x != nullptr) {
      CHECK_EQ(p.rope.head_dim, c.head_dim) << "WriteKv: RoPE's head_dim";
      a.q = p.rope.x;
      a.q_heads = p.rope.num_heads;
      a.q_stride = p.rope.row_stride;
      a.positions = p.rope.positions;
      a.inv_freq = p.rope.inv_freq;
    }
    cuda::LaunchKvWrite(a, stream_);
  }

  void PagedAttention(const PagedAttentionParams& p) override {
    Current();
    const cuda::OpTimes::Scope timed(op_times_, "attention", stream_, recording_);
    AwaitCopies(p.cache);
    CheckOut16Type(p.out16, p.out16_type);
    const cuda::AttnArgs a = cuda::MakeAttnArgs(p);
    const char* problem = cuda::CheckAttentionShape(a);
    CHECK(problem[0] == '\0') << "PagedAttention: " << problem;
    const bool pipelined =
        PipelinedRuns(a.k_layout.dtype, a.head_dim) && cuda::PipelinedAttentionCovers(a);
    cuda::AttnPlan plan = cuda::PlanPagedAttention(
        a, num_sms_, options_.max_attention_workspace_bytes / sizeof(float),
        pipelined ? PipelinedBlocksPerSm(a.k_layout.dtype, a.head_dim)
                  : options_.attention_blocks_per_sm,
        options_.attention_tensor_cores || options_.attention_pipelined, pipelined);
    plan.prefetch_k = plan.tensor_cores && options_.attention_prefetch_k;
    float* workspace = plan.workspace_floats == 0
                           ? nullptr
                           : static_cast<float*>(Scratch(attention_workspace_,
                                                         sizeof(float) * plan.workspace_floats));
    auto* counters = plan.split_counters == 0
                         ? nullptr
                         : static_cast<unsigned*>(
                               Scratch(split_counters_, sizeof(unsigned) * plan.split_counters));
    cuda::LaunchPagedAttention(a, plan, workspace, counters, stream_);
  }

  void ReserveScratch(const StepLimits& l) override {
    Current();
    NotRecording("ReserveScratch");
    cuda::AttnArgs a;
    a.num_seqs = static_cast<int>(std::min<int64_t>(l.seqs, 65535));
    a.num_heads = l.num_heads;
    a.num_kv_heads = l.num_kv_heads;
    a.head_dim = l.head_dim;
    a.max_context_len = static_cast<int>(l.context);
    const size_t floats = a.num_kv_heads > 0 ? MaxAttentionWorkspaceFloats(a, l.tokens) : 0;
    if (floats > 0) Scratch(attention_workspace_, sizeof(float) * floats);
    if (options_.attention_pipelined && a.num_kv_heads > 0) {  // its split merge's counters
      Scratch(split_counters_, sizeof(unsigned) * a.num_seqs * a.num_kv_heads);
    }
    if (const int64_t n = l.rounded_gemm_rows * l.rounded_gemm_k; n > 0) {
      Scratch(rounded_x_, sizeof(uint16_t) * n);
    }
  }

  // Whether the pipelined kernel serves caches of `dtype` at `head_dim`: asked for, and its
  // shared memory fits this device (PipelinedSharedBytes).
  bool PipelinedRuns(KvDType dtype, int head_dim) const {
    return options_.attention_pipelined && dtype != KvDType::kFp32 &&
           (head_dim == 64 || head_dim == 128 || head_dim == 256) &&
           cuda::PipelinedSharedBytes(dtype, head_dim) <= max_shared_optin_;
  }

  // The pipelined kernel's split target: the option, else its measured occupancy for the cache's
  // element type (cached: the query is not cheap).
  int PipelinedBlocksPerSm(KvDType dtype, int head_dim) {
    if (options_.attention_blocks_per_sm > 0) return options_.attention_blocks_per_sm;
    int& n = pipelined_occupancy_[static_cast<int>(dtype)][head_dim == 64    ? 0
                                                           : head_dim == 128 ? 1
                                                                             : 2];
    if (n == 0) n = std::max(1, cuda::PipelinedAttentionBlocksPerSm(dtype, head_dim));
    return n;
  }

  // The most split-KV workspace any step within `a` (limits) asks for: each kernel's plans,
  // the pipelined one at the highest occupancy of any cache type.
  size_t MaxAttentionWorkspaceFloats(const cuda::AttnArgs& a, int64_t tokens) {
    const size_t cap = options_.max_attention_workspace_bytes / sizeof(float);
    // Steps the pipelined kernel does not cover run on tensor cores (PagedAttention).
    size_t most = cuda::MaxPagedAttentionWorkspaceFloats(
        a, tokens, num_sms_, cap, options_.attention_blocks_per_sm,
        options_.attention_tensor_cores || options_.attention_pipelined);
    int blocks = 0;  // the highest occupancy of the instantiations this device runs
    for (const KvDType t :
         {KvDType::kFp16, KvDType::kBf16, KvDType::kFp8E4M3, KvDType::kInt8, KvDType::kInt4}) {
      if (PipelinedRuns(t, a.head_dim)) {
        blocks = std::max(blocks, PipelinedBlocksPerSm(t, a.head_dim));
      }
    }
    if (blocks > 0) {
      most = std::max(most, cuda::MaxPagedAttentionWorkspaceFloats(a, tokens, num_sms_, cap, blocks,
                                                                   /*tensor_cores=*/true,
                                                                   /*pipelined=*/true));
    }
    return most;
  }

  bool MemoryInfo(size_t* free, size_t* total) override {
    Current();
    KVSERVE_CUDA_CHECK(cudaMemGetInfo(free, total));
    return true;
  }

  void AdjustLogits(const AdjustLogitsParams& p) override {
    Current();
    const cuda::OpTimes::Scope timed(op_times_, "adjust_logits", stream_, recording_);
    cuda::LaunchAdjustLogits(p, stream_);
  }

  void Sample(const SampleParams& p) override {
    Current();
    const cuda::OpTimes::Scope timed(op_times_, "sample", stream_, recording_);
    cuda::LaunchSample(p, stream_);
  }

  uint64_t Fingerprint(absl::Span<const ByteRange> ranges) override {
    Current();
    NotRecording("Fingerprint");
    if (ranges.empty()) return 0;
    const size_t bytes = ranges.size() * sizeof(unsigned long long);
    auto* sums = static_cast<unsigned long long*>(Scratch(fingerprint_sums_, bytes));
    KVSERVE_CUDA_CHECK(cudaMemsetAsync(sums, 0, bytes, stream_));
    for (size_t r = 0; r < ranges.size(); ++r) {
      cuda::LaunchFingerprintTerms(ranges[r].data, ranges[r].bytes, sums + r, stream_);
    }
    std::vector<uint64_t> each(ranges.size());
    Download(each.data(), sums, bytes);
    for (size_t r = 0; r < ranges.size(); ++r) each[r] += FingerprintLength(ranges[r].bytes);
    return CombineFingerprints(each.data(), each.size());
  }

  void Logprobs(const LogprobsParams& p) override {
    Current();
    const cuda::OpTimes::Scope timed(op_times_, "logprobs", stream_, recording_);
    cuda::LaunchLogprobs(p, stream_);
  }

  void CopyBlocks(const CopyBlocksParams& p) override {
    Current();
    NotRecording("CopyBlocks");
    if (p.num_pairs == 0 || p.num_layers == 0) return;
    // A ring of segment lists, so that the step's three calls (swap-out, copy-on-write,
    // swap-in) do not wait for one another on the host; a list is reused once the copies that
    // read it are done.
    SegmentBuffer& buf = segment_buffers_[next_segment_buffer_];
    next_segment_buffer_ = (next_segment_buffer_ + 1) % segment_buffers_.size();
    KVSERVE_CUDA_CHECK(cudaEventSynchronize(buf.done));
    const size_t count = static_cast<size_t>(p.num_layers * p.num_pairs * 4);
    if (count > buf.capacity) {
      if (buf.segments != nullptr) KVSERVE_CUDA_CHECK(cudaFreeHost(buf.segments));
      buf.capacity = std::max(count, 2 * buf.capacity);
      KVSERVE_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&buf.segments),
                                       buf.capacity * sizeof(cuda::CopySegment),
                                       cudaHostAllocMapped));
    }
    cuda::CopySegment* segments = buf.segments;
    size_t n = 0;
    std::vector<size_t> layer_end(p.num_layers);
    for (int64_t l = 0; l < p.num_layers; ++l) {
      const KvCacheView& src = p.src_layers[l];
      const KvCacheView& dst = p.dst_layers[l];
      const int64_t heads = src.num_kv_heads, bs = src.block_size, d = src.head_dim;
      const int64_t k_bytes = heads * bs * src.k_format.RowBytes(static_cast<int>(d));
      const int64_t v_bytes = heads * bs * src.v_format.RowBytes(static_cast<int>(d));
      const int64_t k_scale_bytes =
          2 * heads * src.k_format.ScaleEntries(static_cast<int>(bs), static_cast<int>(d));
      const int64_t v_scale_bytes =
          2 * heads * src.v_format.ScaleEntries(static_cast<int>(bs), static_cast<int>(d));
      for (int64_t i = 0; i < p.num_pairs; ++i) {
        const int64_t s = p.src[i], t = p.dst[i];
        segments[n++] = {src.k + s * k_bytes, dst.k + t * k_bytes, k_bytes};
        segments[n++] = {src.v + s * v_bytes, dst.v + t * v_bytes, v_bytes};
        if (k_scale_bytes > 0) {
          segments[n++] = {reinterpret_cast<const uint8_t*>(src.k_scales) + s * k_scale_bytes,
                           reinterpret_cast<uint8_t*>(dst.k_scales) + t * k_scale_bytes,
                           k_scale_bytes};
        }
        if (v_scale_bytes > 0) {
          segments[n++] = {reinterpret_cast<const uint8_t*>(src.v_scales) + s * v_scale_bytes,
                           reinterpret_cast<uint8_t*>(dst.v_scales) + t * v_scale_bytes,
                           v_scale_bytes};
        }
      }
      layer_end[l] = n;
    }
    cuda::CopySegment* device_view = nullptr;
    KVSERVE_CUDA_CHECK(
        cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_view), segments, 0));
    // Copies start after the compute issued so far. They go layer by layer, each layer's done
    // event recorded for the caches it touches: the compute issued later waits only where it
    // touches those caches (AwaitCopies in WriteKv and PagedAttention), so layer l's copies
    // overlap the layers before l.
    KVSERVE_CUDA_CHECK(cudaEventRecord(compute_done_, stream_));
    KVSERVE_CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, compute_done_, 0));
    while (layer_events_.size() < static_cast<size_t>(p.num_layers)) {
      cudaEvent_t e = nullptr;
      KVSERVE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      layer_events_.push_back(e);
    }
    size_t begin = 0;
    for (int64_t l = 0; l < p.num_layers; ++l) {
      cuda::LaunchCopySegments(device_view + begin, static_cast<int64_t>(layer_end[l] - begin),
                               copy_stream_);
      begin = layer_end[l];
      // Re-recording an event that is still pending from an earlier call only makes its wait
      // later (the copy stream is in order); a wait already enqueued keeps the old record.
      const cudaEvent_t e = layer_events_[l];
      KVSERVE_CUDA_CHECK(cudaEventRecord(e, copy_stream_));
      AddPending(p.src_layers[l].k, e);
      AddPending(p.dst_layers[l].k, e);
    }
    KVSERVE_CUDA_CHECK(cudaEventRecord(buf.done, copy_stream_));
  }

 private:
  CudaBackendOptions options_;
  int num_sms_ = 0;
  int pipelined_occupancy_[6][3] = {};  // [KvDType][head_dim 64, 128, 256]; 0: not yet asked
  // Shared memory a block may opt in to (with attention_pipelined or decode_gemv_max_rows), and
  // what of it DecodeGemv's normalized rows may take.
  int max_shared_optin_ = 0;
  int64_t decode_gemv_row_bytes_ = 0;
  cudaStream_t stream_ = nullptr, copy_stream_ = nullptr;
  cudaEvent_t compute_done_ = nullptr;
  // Per-layer copy events, and the caches whose next use must wait for one.
  struct PendingCopy {
    const uint8_t* cache;
    cudaEvent_t done;
  };
  std::vector<cudaEvent_t> layer_events_;
  std::vector<PendingCopy> pending_;
  cublasHandle_t cublas_ = nullptr;
  static constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;
  void* cublas_workspace_ = nullptr;
  // Recorded graphs by id (ids are never reused, so a dropped one stays unknown).
  std::map<int64_t, cudaGraphExec_t> graphs_;
  int64_t next_graph_ = 0;
  bool recording_ = false;
  cuda::DeviceScratch attention_workspace_, rounded_x_;
  cuda::DeviceScratch fingerprint_sums_;  // Fingerprint's, one per range
  // The pipelined kernel's (zero between steps).
  cuda::DeviceScratch split_counters_{/*zeroed=*/true};
  // Outgrown scratch buffers that recorded graphs read, and their bytes.
  std::vector<std::pair<void*, size_t>> kept_scratch_;
  struct SegmentBuffer {
    cuda::CopySegment* segments = nullptr;  // mapped pinned host memory
    size_t capacity = 0;
    cudaEvent_t done = nullptr;  // the copies that read it
  };
  std::array<SegmentBuffer, 4> segment_buffers_;
  size_t next_segment_buffer_ = 0;
  cuda::StagedUploads uploads_;  // Upload's pinned ring
  cuda::OpTimes op_times_;       // EnableOpTiming's
  // StartDownload's events, by ticket modulo their count.
  std::array<cudaEvent_t, 8> download_done_{};
  int64_t next_download_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const CudaBackendOptions& options) {
  auto backend = std::make_unique<CudaBackend>(options);
  if (absl::Status s = backend->Init(); !s.ok()) return s;
  return backend;
}

void* CudaComputeStream(Backend& backend) {
  CHECK_EQ(backend.name(), "cuda");
  return static_cast<CudaBackend&>(backend).stream();
}

absl::Status CheckCudaKvSupport(const KvCacheSpec& spec, int head_dim, int block_size, int device) {
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    cudaGetLastError();
    return absl::UnavailableError(absl::StrCat("CUDA device ", device, " is not usable"));
  }
  if (head_dim != 16 && head_dim != 32 && head_dim != 64 && head_dim != 128 && head_dim != 256) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the CUDA attention kernel covers head_dim 16, 32, 64, 128 and 256, not ", head_dim));
  }
  if (block_size <= 0 || cuda::kChunkTokens % block_size != 0) {
    return absl::FailedPreconditionError(absl::StrCat("--block-size ", block_size, " must divide ",
                                                      cuda::kChunkTokens, " on the CUDA backend"));
  }
  for (size_t l = 0; l < spec.k.size(); ++l) {
    for (const KvFormat* f : {&spec.k[l], &spec.v[l]}) {
      if (f->dtype == KvDType::kFp8E4M3 && major * 10 + minor < 89) {
        return absl::FailedPreconditionError(
            absl::StrCat("KV cache layer ", l, " is ", f->Describe(),
                         ": fp8 needs compute capability 8.9 or "
                         "newer, device ",
                         device, " is ", major, ".", minor, " (use --kv-cache-dtype int8)"));
      }
      if (f->granularity == KvGranularity::kPerGroup &&
          (f->group_size < 8 || (f->group_size & (f->group_size - 1)) != 0)) {
        return absl::FailedPreconditionError(
            absl::StrCat("KV cache layer ", l, " is ", f->Describe(),
                         ": the CUDA backend needs per-group sizes that are powers of two >= 8"));
      }
    }
    if (spec.k[l].dtype != spec.v[l].dtype) {
      return absl::FailedPreconditionError(
          absl::StrCat("KV cache layer ", l, ": K and V must share an element type on CUDA"));
    }
  }
  return absl::OkStatus();
}

}  // namespace kvserve::kernels
