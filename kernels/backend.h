// The compute primitives of a worker, behind one interface with a CPU reference
// implementation (kernels/cpu) and a CUDA one (kernels/cuda). Every op takes a
// params struct of plain pointers and sizes ("host launcher" style); pointers are device
// pointers for a device backend. All activations are float32, row-major.
//
//   std::unique_ptr<Backend> cpu = CreateCpuBackend({.num_threads = 1});
//   cpu->Gemm({.x = h, .w = wq, .y = q, .m = tokens, .n = q_dim, .k = hidden});
//
// Thread-compatible: one backend instance per engine thread (which owns its stream).
#ifndef KVSERVE_KERNELS_BACKEND_H_
#define KVSERVE_KERNELS_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/kv/kv_format.h"
#include "common/model/dtype.h"
#include "kernels/fingerprint.h"
#include "kernels/logits_processing.h"
#include "kernels/sampling.h"

namespace kvserve::kernels {

// y[m, n] = x[m, k] · w[n, k]ᵀ (+ bias[n]), accumulated in float32. w is float32, fp16 or
// bf16 (w_type); with 16-bit weights x is rounded to the same type first (tensor cores on
// CUDA; the CPU backend widens both to float32 per call, slowly, as the twin), or comes so
// rounded in x16 (an RmsNorm's or SiluMul's out16), which saves CUDA a rounding launch.
struct GemmParams {
  const float* x = nullptr;
  const void* w = nullptr;
  const float* bias = nullptr;  // optional
  float* y = nullptr;
  int64_t m = 0, n = 0, k = 0;
  DType w_type = DType::kF32;     // kF32 | kF16 | kBF16
  const uint16_t* x16 = nullptr;  // 16-bit w_type only: x rounded to w_type, used instead of x
};

// out[t, :] = table[ids[t], :], widened to float32 from the table's type (kF32 | kF16 | kBF16).
// Also the model's row gather (the rows whose logits are wanted).
struct EmbeddingParams {
  const int32_t* ids = nullptr;
  const void* table = nullptr;
  float* out = nullptr;
  int64_t num_tokens = 0, hidden = 0;
  DType table_type = DType::kF32;
};

// With `residual`: residual += x, then out = rmsnorm(residual) · weight. Without: out =
// rmsnorm(x) · weight. Rows of `hidden` values; in-place (out == x) is allowed. Rows are
// contiguous, or (group_rows > 0, no residual) come in groups of group_rows contiguous rows,
// group g starting g · group_stride floats in (x and out alike): row r at
// (r / group_rows) · group_stride + (r % group_rows) · hidden, e.g. the per-head q / k norms
// over the heads of every token's qkv row. With out16 (contiguous rows only), the result goes
// there instead of `out`, rounded to out16_type (kF16 | kBF16): a Gemm's x16.
struct RmsNormParams {
  const float* x = nullptr;
  float* residual = nullptr;  // optional
  const float* weight = nullptr;
  float* out = nullptr;
  int64_t rows = 0, hidden = 0;
  float eps = 1e-6f;
  int64_t group_rows = 0, group_stride = 0;
  uint16_t* out16 = nullptr;
  DType out16_type = DType::kBF16;

  [[nodiscard]] int64_t RowOffset(int64_t r) const {
    return group_rows > 0 ? r / group_rows * group_stride + r % group_rows * hidden : r * hidden;
  }
};

// Rotary embedding (Hugging Face's rotate_half layout) applied in place to `num_heads` heads
// of `head_dim` in each token row of `x` (row stride `row_stride` floats). inv_freq has
// head_dim / 2 entries (see rope.h for default / linear / llama3 scaling).
struct RopeParams {
  float* x = nullptr;
  const int32_t* positions = nullptr;
  const float* inv_freq = nullptr;
  int64_t num_tokens = 0, num_heads = 0, head_dim = 0, row_stride = 0;
};

// out[t, i] = silu(gate_up[t, i]) · gate_up[t, inter + i]; with out16, there instead of `out`,
// rounded to out16_type (kF16 | kBF16).
struct SiluMulParams {
  const float* gate_up = nullptr;
  float* out = nullptr;
  int64_t num_tokens = 0, inter = 0;
  uint16_t* out16 = nullptr;
  DType out16_type = DType::kBF16;
};

// A decode step's projection in one op, with the RMSNorm before it and the SiLU·mul after it
// fused in: for steps of at most Backend::DecodeGemvRows(k) token rows and 16-bit weights
// (w_type kF16 | kBF16). The input rows are x16 (already rounded to w_type), or, with
// norm.weight, what RmsNorm writes as out16: r = norm.x (+ norm.residual_in), stored to
// norm.residual_out when given, and rmsnorm(r) · norm.weight rounded to w_type, bit for bit.
// Then z[m, ·] = x · wᵀ (+ bias) in float32 sums, and the result is z in y ([m, n]); or, with
// silu_mul, w holds [gate; up] (2n rows, bias 2n) and out16[t, i] = silu(z[t, i]) · z[t, n + i]
// rounded to w_type, as SiluMul's out16. residual_out aliases neither norm.x nor residual_in.
// The sums run in the backend's own order: z is within float32 rounding of Gemm's.
struct DecodeGemvParams {
  const uint16_t* x16 = nullptr;
  struct Norm {
    const float* x = nullptr;
    const float* residual_in = nullptr;  // optional
    float* residual_out = nullptr;       // optional
    const float* weight = nullptr;       // set: the input is normalized
    float eps = 1e-6f;
  } norm;
  const void* w = nullptr;
  DType w_type = DType::kBF16;
  const float* bias = nullptr;  // optional
  int64_t m = 0, n = 0, k = 0;
  float* y = nullptr;
  bool silu_mul = false;
  uint16_t* out16 = nullptr;  // silu_mul's [m, n]
};

// A layer's paged KV cache: K and V data of [num_blocks, num_kv_heads, block_size, head_dim]
// elements in their KvFormat, and their fp16 scales (null when unquantized). kv_quant.h gives
// the exact layout.
struct KvCacheView {
  uint8_t* k = nullptr;
  uint8_t* v = nullptr;
  uint16_t* k_scales = nullptr;
  uint16_t* v_scales = nullptr;
  KvFormat k_format, v_format;
  int64_t num_blocks = 0, num_kv_heads = 0, block_size = 0, head_dim = 0;
};

// Writes each token's K and V rows (num_kv_heads × head_dim, row stride `row_stride`) into
// slot slot_mapping[t] = block · block_size + offset, quantizing to the cache's format. A slot
// of -1 is skipped. Tokens of one block must come in position order (per-channel scales grow
// with each token and earlier codes are re-encoded when they do).
//
// With `rope` set (positions and inv_freq as RopeParams'), the rotary embedding is applied in
// the same pass: each K row is rotated on its way into the cache, and each token's
// rope.num_heads query heads at rope.x (row stride rope.row_stride) are rotated in place, as
// Rope would; the K rows read are left unspecified. One launch where Rope and WriteKv take two.
struct WriteKvParams {
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t row_stride = 0;
  const int64_t* slot_mapping = nullptr;
  int64_t num_tokens = 0;
  KvCacheView cache;
  RopeParams rope;  // rope.x (the queries) null: no rotation
};

// Causal attention of each sequence's query tokens over its cached context, dequantizing K and
// V as they are read (there is no separate dequantize pass). Sequence s owns
// query rows [query_start[s], query_start[s] + query_len[s]) and has context_len[s] tokens in
// the cache (its query tokens are the last ones), found through its block table
// (block_tables[s * max_blocks_per_seq + i]). q rows have num_heads × head_dim values with
// row stride q_stride; out rows num_heads × head_dim, contiguous. GQA: query head h reads KV
// head h / (num_heads / num_kv_heads).
struct PagedAttentionParams {
  const float* q = nullptr;
  int64_t q_stride = 0;
  float* out = nullptr;
  KvCacheView cache;
  const int32_t* query_start = nullptr;
  const int32_t* query_len = nullptr;
  const int32_t* context_len = nullptr;
  const int32_t* block_tables = nullptr;
  int64_t num_seqs = 0, max_blocks_per_seq = 0, num_heads = 0;
  float scale = 1.0f;
  // Upper bounds of query_len[] and context_len[] (device backends size their grids with them
  // without reading device memory); 0 means unknown, which the CUDA backend rejects.
  int64_t max_query_len = 0, max_context_len = 0;
  // With out16, the output goes there instead of `out`, rounded to out16_type (kF16 | kBF16):
  // the O projection's x16.
  uint16_t* out16 = nullptr;
  DType out16_type = DType::kBF16;
};

// Copies whole blocks (data and scales of K and V, every layer) from block src[i] of
// src_layers to block dst[i] of dst_layers: copy-on-write within a pool (same views) or swap
// between the device pool and the host pool (same formats). On a device backend the copies
// run on their own stream after the ops issued before, and may still run when CopyBlocks
// returns: WriteKv and PagedAttention on a copied layer wait for that layer's copies (so they
// overlap the layers before it); anything else that reads or writes the pools must Synchronize
// first.
// Bytes of backend memory.
struct ByteRange {
  const void* data = nullptr;
  size_t bytes = 0;
};

// dst[rows[i]] = src[from[i]] for i < n, int32 values in backend memory (rows and from too):
// the previous step's drawn tokens (src: its samples) into this step's token ids, on the device,
// where async scheduling planned the step before the host knew them.
struct GatherTokensParams {
  int32_t* dst = nullptr;
  const int32_t* src = nullptr;
  const int32_t* rows = nullptr;
  const int32_t* from = nullptr;
  int64_t n = 0;
};

struct CopyBlocksParams {
  const KvCacheView* src_layers = nullptr;
  const KvCacheView* dst_layers = nullptr;
  int64_t num_layers = 0;
  const int32_t* src = nullptr;
  const int32_t* dst = nullptr;
  int64_t num_pairs = 0;
};

// The largest steps a backend will run, for ReserveScratch: this rank's attention heads, and
// the largest Gemm whose float x a 16-bit weight's Gemm rounds (the LM head's rows).
struct StepLimits {
  int64_t tokens = 0;   // query tokens in a step
  int64_t seqs = 0;     // sequences in a step
  int64_t context = 0;  // tokens a sequence attends to
  int num_heads = 0, num_kv_heads = 0, head_dim = 0;
  int64_t rounded_gemm_rows = 0, rounded_gemm_k = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  [[nodiscard]] virtual std::string_view name() const = 0;

  // Memory the ops read and write: device memory on a device backend, ordinary memory on the
  // CPU. Zero-filled. Allocate / Free are not for every step (they may synchronize).
  virtual void* Allocate(size_t bytes) = 0;
  virtual void Free(void* p) = 0;
  // Host memory that CopyBlocks can move blocks to and from (the swap pool): pinned and mapped
  // on CUDA.
  virtual void* AllocateHost(size_t bytes) = 0;
  virtual void FreeHost(void* p) = 0;
  // Copies between host memory and backend memory, ordered after the ops issued before them;
  // both return once `src` may be reused (Download: once `dst` holds the data).
  virtual void Upload(void* dst, const void* src, size_t bytes) = 0;
  virtual void Download(void* dst, const void* src, size_t bytes) = 0;
  // A download that returns at once: `bytes` of backend memory at `src` land in host memory at
  // `dst` (AllocateHost's on a device: pinned) after the ops issued before it, once
  // WaitDownload(the returned ticket) returns; `dst` must stay until then. The CPU copies at
  // once. Tickets are waited for in order, and one at most 8 downloads old is still known.
  virtual int64_t StartDownload(void* dst, const void* src, size_t bytes) {
    Download(dst, src, bytes);
    return 0;
  }
  virtual void WaitDownload(int64_t /*ticket*/) {}
  // Backend memory to backend memory, in op order.
  virtual void Copy(void* dst, const void* src, size_t bytes) = 0;
  // The fingerprint (kernels/fingerprint.h, CombineFingerprints) of `ranges` of backend
  // memory, after the ops issued before it: the same on every backend for the same bytes. A
  // device backend computes it where the bytes are; this default downloads them.
  virtual uint64_t Fingerprint(absl::Span<const ByteRange> ranges) {
    std::vector<uint64_t> each;
    std::vector<unsigned char> host;
    for (const ByteRange& r : ranges) {
      host.resize(r.bytes);
      Download(host.data(), r.data, r.bytes);
      each.push_back(FingerprintBytes(host.data(), r.bytes));
    }
    return CombineFingerprints(each.data(), each.size());
  }
  // Returns when every op issued so far is done (a no-op on the CPU). Needed before handing
  // buffers to a communicator that runs on its own stream (NCCL).
  virtual void Synchronize() = 0;
  // The stream the ops run on (a cudaStream_t on CUDA), for a communicator that can order its
  // collectives on it (Communicator::EnqueueAllReduceSum); null on the CPU.
  virtual void* OpStream() { return nullptr; }
  // The device's free and total memory in bytes; false where the backend has no device memory
  // of its own (the CPU).
  virtual bool MemoryInfo(size_t* free, size_t* total) {
    *free = *total = 0;
    return false;
  }
  // Allocates the scratch memory of the backend's own that ops within `limits` need (the CUDA
  // backend's split-KV workspace and Gemm rounding buffer), which they would otherwise grow into
  // on first need: so that it is in use when the memory left for the KV pool is measured, and
  // serving allocates none.
  virtual void ReserveScratch(const StepLimits& /*limits*/) {}
  // The device memory the backend's own scratch buffers hold, by its own count: the current
  // ones and those kept for recorded graphs (0 on the CPU). A stream-ordered pool (CUDA's
  // cudaMallocAsync) need not return freed memory to the device, so MemoryInfo cannot say.
  [[nodiscard]] virtual size_t ScratchBytes() const { return 0; }
  // Device time per op, for a step's breakdown by kernel (CUDA: events around each op on the
  // compute stream, a graph replay timed as one op, "graph"; none while a graph records). Off
  // by default; nothing on the CPU. TakeOpTimes waits for the ops timed so far and returns
  // their milliseconds and calls by op name, clearing them.
  struct OpTime {
    double ms = 0;
    int64_t count = 0;
  };
  virtual void EnableOpTiming(bool /*on*/) {}
  virtual std::map<std::string, OpTime> TakeOpTimes() { return {}; }

  // Graphs (CUDA graphs; SupportsGraphs is false on the CPU): ops issued between BeginGraph and
  // EndGraph are recorded, not run, and ReplayGraph issues them again as one launch with the
  // same pointers and sizes (false for a dropped or unknown graph). While recording, issue no
  // Upload, Download, Synchronize, Allocate, Free or CopyBlocks, and no op that needs more
  // scratch than it did before; buffers a graph reads stay until DropGraphs. Recording and
  // replay wait for the block copies issued so far. Out of device memory, BeginGraph or EndGraph
  // return ResourceExhausted and nothing stays recorded.
  [[nodiscard]] virtual bool SupportsGraphs() const { return false; }
  virtual absl::Status BeginGraph() { return absl::OkStatus(); }
  virtual absl::StatusOr<int64_t> EndGraph() { return -1; }
  virtual bool ReplayGraph(int64_t /*graph*/) { return false; }
  virtual void DropGraphs() {}

  virtual void Gemm(const GemmParams& p) = 0;
  // The most token rows DecodeGemv serves fast with a normalized input of k columns (0: none;
  // the model then runs RmsNorm, Gemm and SiluMul). By default none: DecodeGemv is then the
  // three ops in a row over scratch it allocates and frees (after a Synchronize), the reference
  // the CUDA backend's fused kernel is tested against.
  [[nodiscard]] virtual int64_t DecodeGemvRows(int64_t /*k*/) const { return 0; }
  virtual void DecodeGemv(const DecodeGemvParams& p);
  virtual void Embedding(const EmbeddingParams& p) = 0;
  virtual void RmsNorm(const RmsNormParams& p) = 0;
  virtual void Rope(const RopeParams& p) = 0;
  virtual void SiluMul(const SiluMulParams& p) = 0;
  virtual void WriteKv(const WriteKvParams& p) = 0;
  virtual void PagedAttention(const PagedAttentionParams& p) = 0;
  virtual void CopyBlocks(const CopyBlocksParams& p) = 0;
  // GatherTokensParams' rule. By default through the host (a wait); the CPU and CUDA backends
  // do it in place, in op order.
  virtual void GatherTokens(const GatherTokensParams& p);
  // Changes logits rows in place by the rule of kernels/logits_processing.h (penalties, biases,
  // bans, allowed ids), before Sample and Logprobs.
  virtual void AdjustLogits(const AdjustLogitsParams& p) = 0;
  // Draws tokens by the rule of kernels/sampling.h (the same tokens on every backend).
  virtual void Sample(const SampleParams& p) = 0;
  // Log-probabilities of drawn tokens and the top alternatives (kernels/sampling.h).
  virtual void Logprobs(const LogprobsParams& p) = 0;
};

struct CpuBackendOptions {
  int num_threads = 1;  // OpenBLAS threads
};
std::unique_ptr<Backend> CreateCpuBackend(const CpuBackendOptions& options);

}  // namespace kvserve::kernels

#endif  // KVSERVE_KERNELS_BACKEND_H_
