// Device code of GPU sampling (kernels/sampling.h's rule; launchers in sampling.cu): one thread
// block of 512 threads per request. Block-wide reductions and scans are CUB's; the radix
// histogram adds up equal digits within a warp first (cooperative groups). The tests also run
// it on the CPU under tests/testing/cuda_emulator/emulator.h, which provides those pieces there.
#ifndef KVSERVE_KERNELS_CUDA_OPS_SAMPLING_CUH_
#define KVSERVE_KERNELS_CUDA_OPS_SAMPLING_CUH_

#include <cstdint>

#if !defined(KVSERVE_CUDA_EMULATION)
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#endif

#include "kernels/cuda/device/shared_memory.cuh"
#include "kernels/sampling.h"

namespace kvserve::kernels::cuda::sampling {

namespace cg = cooperative_groups;

constexpr int kThreads = 512;

// One request's logits row, possibly in vocabulary slices (SampleParams).
struct Row {
  const float* base;  // the row's first slice
  int64_t vocab, shard, shard_stride;
  __device__ Row(const float* logits, int64_t num_rows, int64_t vocab_size, int64_t shard_vocab,
                 int64_t r)
      : vocab(vocab_size), shard(shard_vocab > 0 ? shard_vocab : vocab_size) {
    base = logits + r * shard;
    shard_stride = num_rows * shard;
  }
  __device__ float At(int64_t i) const {
    if (shard == vocab) return base[i];
    const int64_t s = static_cast<int32_t>(i) / static_cast<int32_t>(shard);
    return base[s * shard_stride + (i - s * shard)];
  }
};

struct ArgMax {
  float value;
  int64_t id;  // INT64_MAX: none yet
};

// Larger value first, then the lower id (a total order on non-NaN values, so any reduction
// order gives the CPU's answer).
struct BetterOf {
  __device__ ArgMax operator()(const ArgMax& a, const ArgMax& b) const {
    if (a.id == INT64_MAX) return b;
    if (b.id == INT64_MAX) return a;
    if (a.value != b.value) return a.value > b.value ? a : b;
    return a.id < b.id ? a : b;
  }
};

struct MaxOf {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

struct Shared {
  union {
    cub::BlockReduce<ArgMax, kThreads>::TempStorage argmax;
    cub::BlockReduce<uint64_t, kThreads>::TempStorage sum;
    cub::BlockReduce<float, kThreads>::TempStorage max;
    cub::BlockReduce<double, kThreads>::TempStorage dsum;
    cub::BlockScan<uint64_t, kThreads>::TempStorage scan;
  } cub;
  uint32_t counts[kRadixBuckets];
  uint64_t sums[kRadixBuckets];
  RadixSelect select;
  int64_t found;
  float max_logit;
  uint64_t total;
  double dtotal;
  int top_count;
  int32_t top_ids[kMaxTopLogprobs];
  // The candidates (kernels/sampling.h), compacted in id order.
  int32_t candidate_ids[kMaxCandidates];
  uint64_t candidate_w[kMaxCandidates];
};

// Shared as 16-byte words (a __shared__ variable cannot have a constructor; Shared's members
// have default initializers).
static_assert(alignof(Shared) <= alignof(uint4));
constexpr int kSharedWords = (sizeof(Shared) + sizeof(uint4) - 1) / sizeof(uint4);

// What the selection and draw passes walk: `count` tokens in id order, the i-th with id(i) and
// key(i). The whole row (weights for sampling, OrderedKey for the top logprobs) or the
// compacted candidates.
struct RowWeights {
  const Row* row;
  float max, inv_t;
  __device__ int64_t count() const { return row->vocab; }
  __device__ uint64_t key(int64_t i) const { return TokenWeight(row->At(i), max, inv_t); }
  __device__ int64_t id(int64_t i) const { return i; }
};

struct RowLogitKeys {
  const Row* row;
  __device__ int64_t count() const { return row->vocab; }
  __device__ uint64_t key(int64_t i) const { return OrderedKey(row->At(i)); }
  __device__ int64_t id(int64_t i) const { return i; }
};

struct Candidates {
  const int32_t* ids;
  const uint64_t* w;
  int64_t n;
  __device__ int64_t count() const { return n; }
  __device__ uint64_t key(int64_t i) const { return w[i]; }
  __device__ int64_t id(int64_t i) const { return ids[i]; }
};

// Each thread's contiguous share of [0, count), for the passes that walk ids in order.
struct Chunk {
  int64_t begin, end;
  __device__ explicit Chunk(int64_t count) {
    const int64_t size = (count + kThreads - 1) / kThreads;
    begin = min(count, threadIdx.x * size);
    end = min(count, begin + size);
  }
};

__device__ uint64_t BlockSum(uint64_t x, Shared& sh) {
  __syncthreads();  // the union may still be in use
  const uint64_t total = cub::BlockReduce<uint64_t, kThreads>(sh.cub.sum).Sum(x);
  if (threadIdx.x == 0) sh.total = total;
  __syncthreads();
  return sh.total;
}

// The id of the `nth` (1-based) token of `src` whose key is exactly `value`, in id order.
template <typename Source>
__device__ int64_t NthTie(const Source& src, uint64_t value, uint64_t nth, Shared& sh) {
  const Chunk c(src.count());
  uint64_t count = 0;
  for (int64_t i = c.begin; i < c.end; ++i) count += src.key(i) == value;
  uint64_t before = 0;
  __syncthreads();
  cub::BlockScan<uint64_t, kThreads>(sh.cub.scan).ExclusiveSum(count, before);
  if (before < nth && nth <= before + count) {
    uint64_t seen = before;
    for (int64_t i = c.begin; i < c.end; ++i) {
      if (src.key(i) == value && ++seen == nth) {
        sh.found = src.id(i);
        break;
      }
    }
  }
  __syncthreads();
  return sh.found;
}

// Runs `sel` to the end over the keys of `src` (one histogram pass per digit).
template <typename Source>
__device__ SampleCut Select(const Source& src, RadixSelect sel, Shared& sh) {
  const int64_t count = src.count();
  while (!sel.done()) {
    for (int b = threadIdx.x; b < kRadixBuckets; b += kThreads) {
      sh.counts[b] = 0;
      sh.sums[b] = 0;
    }
    __syncthreads();
    // Every lane runs every iteration, so the warp is converged for the partition.
    for (int64_t base = 0; base < count; base += kThreads) {
      const int64_t i = base + threadIdx.x;
      const uint64_t w = i < count ? src.key(i) : 0;
      const bool take = i < count && sel.Matches(w);
      const int digit = take ? sel.Digit(w) : -1;
      // Lanes with the same digit add up first: most of a vocabulary shares a few buckets.
      const cg::coalesced_group peers = cg::labeled_partition(cg::coalesced_threads(), digit);
      const uint64_t sum = cg::reduce(peers, take ? w : uint64_t{0}, cg::plus<uint64_t>());
      if (take && peers.thread_rank() == 0) {
        atomicAdd(&sh.counts[digit], peers.size());
        atomicAdd(reinterpret_cast<unsigned long long*>(&sh.sums[digit]),
                  static_cast<unsigned long long>(sum));
      }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      sel.Choose(sh.counts, sh.sums);
      sh.select = sel;
    }
    __syncthreads();
    sel = sh.select;
  }
  SampleCut cut;
  cut.value = sel.value();
  cut.mass = sel.mass();
  cut.last_tie = INT64_MAX;  // every tie (of `src`; the draw walks `src` too)
  if (sel.ties() < sel.tie_count()) cut.last_tie = NthTie(src, cut.value, sel.ties(), sh);
  return cut;
}

// The rule's steps after min-p, over `src` (which holds the answer): top-k, top-p, the draw —
// the first kept token, in id order, at which the running sum of kept weights passes the
// target. Returns the token (every thread), or -1 when nothing weighs anything.
template <typename Source>
__device__ int64_t SelectAndDraw(const Source& src, const SampleRequest& r, SampleCut cut,
                                 uint64_t num_min_p, Shared& sh) {
  if (r.top_k > 0 && static_cast<uint64_t>(r.top_k) < num_min_p) {
    RadixSelect sel;
    sel.goal = RadixSelect::kCount;
    sel.target = static_cast<uint64_t>(r.top_k);
    cut = Select(src, sel, sh);
  }
  if (r.top_p < 1.0f && cut.mass > 0) {
    RadixSelect sel;
    sel.goal = RadixSelect::kMass;
    sel.target = TopPTarget(r.top_p, cut.mass);
    cut = Select(src, sel, sh);
  }
  if (cut.mass == 0) return -1;
  const uint64_t target = DrawTarget(DrawBits(r.seed, r.step), cut.mass);
  const Chunk c(src.count());
  uint64_t kept = 0;
  for (int64_t i = c.begin; i < c.end; ++i) {
    const uint64_t w = src.key(i);
    if (cut.Keeps(w, src.id(i))) kept += w;
  }
  uint64_t before = 0;
  __syncthreads();
  cub::BlockScan<uint64_t, kThreads>(sh.cub.scan).ExclusiveSum(kept, before);
  if (before <= target && target < before + kept) {
    uint64_t sum = before;
    for (int64_t i = c.begin; i < c.end; ++i) {
      const uint64_t w = src.key(i);
      if (!cut.Keeps(w, src.id(i))) continue;
      sum += w;
      if (sum > target) {
        sh.found = src.id(i);
        break;
      }
    }
  }
  __syncthreads();
  return sh.found;
}

__global__ void __launch_bounds__(kThreads) SampleKernel(SampleParams p) {
  KVSERVE_SHARED(uint4[kSharedWords], sh_words);  // raw: no constructor runs
  Shared& sh = *reinterpret_cast<Shared*>(sh_words);
  const SampleRequest r = p.requests[blockIdx.x];
  const Row row(p.logits, p.num_rows, p.vocab, p.shard_vocab, r.row);

  ArgMax mine{0.0f, INT64_MAX};
  for (int64_t i = threadIdx.x; i < row.vocab; i += kThreads) {
    const float l = row.At(i);
    if (!isnan(l) && (mine.id == INT64_MAX || l > mine.value)) mine = {l, i};
  }
  const ArgMax best = cub::BlockReduce<ArgMax, kThreads>(sh.cub.argmax).Reduce(mine, BetterOf());
  if (threadIdx.x == 0) {
    sh.found = best.id == INT64_MAX ? 0 : best.id;
    sh.max_logit = best.id == INT64_MAX ? -INFINITY : best.value;
  }
  __syncthreads();
  const int64_t argmax = sh.found;
  const float max = sh.max_logit;
  if (!(r.temperature >= kGreedyTemperature)) {
    if (threadIdx.x == 0) p.tokens[blockIdx.x] = static_cast<int32_t>(argmax);
    return;
  }
  const float inv_t = InverseTemperature(r.temperature);
  const RowWeights all{&row, max, inv_t};

  // Min-p, and the candidates when a selection might be confined to them.
  const uint64_t min_w = MinPWeight(r.min_p), floor = CandidateFloor(min_w);
  const bool may_confine = r.top_k > 0 || r.top_p < 1.0f || min_w == floor;
  uint64_t count = 0, mass = 0, cand_count = 0, cand_mass = 0;
  for (int64_t i = threadIdx.x; i < row.vocab; i += kThreads) {
    const uint64_t w = all.key(i);
    if (w >= min_w) {
      ++count;
      mass += w;
    }
    if (may_confine && w >= floor) {
      ++cand_count;
      cand_mass += w;
    }
  }
  const uint64_t num_min_p = BlockSum(count, sh);
  SampleCut cut;
  cut.value = min_w == 0 ? 0 : min_w - 1;
  cut.last_tie = min_w == 0 ? row.vocab - 1 : -1;
  cut.mass = BlockSum(mass, sh);
  bool confine = false;
  int64_t num_candidates = 0;
  if (may_confine) {
    num_candidates = static_cast<int64_t>(BlockSum(cand_count, sh));
    const uint64_t candidates_mass = BlockSum(cand_mass, sh);
    confine = CandidatesSuffice(r, min_w, static_cast<uint64_t>(num_candidates), candidates_mass,
                                num_min_p, cut.mass);
  }
  int64_t token;
  if (confine) {
    // Compact the candidates in id order: each thread's contiguous share, placed by a scan.
    const Chunk c(row.vocab);
    uint64_t mine_count = 0;
    for (int64_t i = c.begin; i < c.end; ++i) mine_count += all.key(i) >= floor;
    uint64_t at = 0;
    __syncthreads();
    cub::BlockScan<uint64_t, kThreads>(sh.cub.scan).ExclusiveSum(mine_count, at);
    for (int64_t i = c.begin; i < c.end; ++i) {
      const uint64_t w = all.key(i);
      if (w < floor) continue;
      sh.candidate_ids[at] = static_cast<int32_t>(i);
      sh.candidate_w[at] = w;
      ++at;
    }
    __syncthreads();
    token = SelectAndDraw(Candidates{sh.candidate_ids, sh.candidate_w, num_candidates}, r, cut,
                          num_min_p, sh);
  } else {
    token = SelectAndDraw(all, r, cut, num_min_p, sh);
  }
  if (threadIdx.x == 0) p.tokens[blockIdx.x] = static_cast<int32_t>(token < 0 ? argmax : token);
}

// One block per request: log-sum-exp of the row (in double, as the CPU twin), the drawn
// token's log-probability, and the top_n ids by radix selection on OrderedKey(logit), sorted.
__global__ void __launch_bounds__(kThreads) LogprobsKernel(LogprobsParams p) {
  KVSERVE_SHARED(uint4[kSharedWords], sh_words);  // raw: no constructor runs
  Shared& sh = *reinterpret_cast<Shared*>(sh_words);
  const LogprobRequest q = p.requests[blockIdx.x];
  const Row row(p.logits, p.num_rows, p.vocab, p.shard_vocab, q.row);
  float mine = -INFINITY;
  for (int64_t i = threadIdx.x; i < row.vocab; i += kThreads) {
    const float l = row.At(i);
    if (!isnan(l)) mine = fmaxf(mine, l);
  }
  const float block_max = cub::BlockReduce<float, kThreads>(sh.cub.max).Reduce(mine, MaxOf());
  if (threadIdx.x == 0) sh.max_logit = block_max;
  __syncthreads();
  const double max = sh.max_logit;
  const float token = row.At(q.sample >= 0 ? p.tokens[q.sample] : q.token);
  double sum = 0.0;
  uint64_t at_least = 0;
  for (int64_t i = threadIdx.x; i < row.vocab; i += kThreads) {
    const float l = row.At(i);
    sum += exp(static_cast<double>(l) - max);
    at_least += l >= token ? 1 : 0;
  }
  __syncthreads();  // the union held the float reduction
  const double block_sum = cub::BlockReduce<double, kThreads>(sh.cub.dsum).Sum(sum);
  if (threadIdx.x == 0) sh.dtotal = block_sum;
  __syncthreads();
  const uint64_t block_rank = cub::BlockReduce<uint64_t, kThreads>(sh.cub.sum).Sum(at_least);
  const double log_z = max + log(sh.dtotal);
  if (threadIdx.x == 0) {
    p.logprob[blockIdx.x] = static_cast<float>(token - log_z);
    p.rank[blockIdx.x] = static_cast<int32_t>(block_rank);
  }
  __syncthreads();  // the union held the rank's reduction
  const int n =
      static_cast<int>(min(static_cast<int64_t>(min(q.top_n, kMaxTopLogprobs)), row.vocab));
  if (n <= 0) return;
  const RowLogitKeys keys{&row};
  const auto key = [&](int64_t i) -> uint64_t { return keys.key(i); };
  RadixSelect sel;
  sel.goal = RadixSelect::kCount;
  sel.target = static_cast<uint64_t>(n);
  sel.hi = 32;
  const SampleCut cut = Select(keys, sel, sh);
  if (threadIdx.x == 0) sh.top_count = 0;
  __syncthreads();
  for (int64_t i = threadIdx.x; i < row.vocab; i += kThreads) {
    if (!cut.Keeps(key(i), i)) continue;
    const int slot = atomicAdd(&sh.top_count, 1);  // exactly n take a slot
    if (slot < kMaxTopLogprobs) sh.top_ids[slot] = static_cast<int32_t>(i);
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  // Best first: larger key, then lower id (insertion sort of at most 20).
  int32_t* ids = sh.top_ids;
  for (int a = 1; a < n; ++a) {
    const int32_t id = ids[a];
    const uint64_t k = key(id);
    int b = a;
    for (; b > 0 && (key(ids[b - 1]) < k || (key(ids[b - 1]) == k && ids[b - 1] > id)); --b) {
      ids[b] = ids[b - 1];
    }
    ids[b] = id;
  }
  for (int a = 0; a < n; ++a) {
    p.top_ids[blockIdx.x * kMaxTopLogprobs + a] = ids[a];
    p.top_logprobs[blockIdx.x * kMaxTopLogprobs + a] = static_cast<float>(row.At(ids[a]) - log_z);
  }
}

}  // namespace kvserve::kernels::cuda::sampling

#endif  // KVSERVE_KERNELS_CUDA_OPS_SAMPLING_CUH_
