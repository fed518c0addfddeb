#include "worker/model/decode_graphs.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "glog/logging.h"

namespace kvserve::worker {
namespace {

// Room for this many sampling (and logprobs) requests per batch row: a row draws several
// tokens when a request with n > 1 samples its first token.
constexpr int64_t kSamplesPerRow = 2;

size_t Align8(size_t n) { return (n + 7) / 8 * 8; }

}  // namespace

int64_t DecodeGraphs::BatchBucket(int64_t seqs, int64_t max_batch) {
  const int64_t bucket = seqs <= 4
                             ? static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(seqs)))
                             : (seqs + 7) / 8 * 8;
  return std::min(bucket, max_batch);
}

int64_t DecodeGraphs::WidthBucket(int64_t blocks, int64_t max_blocks_per_seq) {
  const auto width = std::bit_ceil(static_cast<uint64_t>(std::max(blocks, kMinWidth)));
  return std::min(static_cast<int64_t>(width), max_blocks_per_seq);
}

std::vector<DecodeGraphs::Bucket> DecodeGraphs::Buckets(int64_t max_batch,
                                                        int64_t max_blocks_per_seq) {
  // Each size's bucket, largest first (bucket sizes only grow with the size).
  std::vector<int64_t> batches, widths;
  for (int64_t s = max_batch; s >= 1; --s) {
    if (batches.empty() || BatchBucket(s, max_batch) != batches.back()) {
      batches.push_back(BatchBucket(s, max_batch));
    }
  }
  for (int64_t s = max_blocks_per_seq; s >= 1; --s) {
    if (widths.empty() || WidthBucket(s, max_blocks_per_seq) != widths.back()) {
      widths.push_back(WidthBucket(s, max_blocks_per_seq));
    }
  }
  std::vector<Bucket> buckets;
  for (int64_t b : batches) {
    for (int64_t w : widths) buckets.emplace_back(b, w);
  }
  return buckets;
}

DecodeGraphs::DecodeGraphs(kernels::Backend* backend, const DecodeGraphOptions& options)
    : backend_(backend), options_(options) {
  CHECK_GT(options.max_batch, 0);
  CHECK_GT(options.max_blocks_per_seq, 0);
  const auto g = static_cast<size_t>(options.max_batch);
  size_t at = 0;
  auto take = [&](size_t bytes) {
    const size_t here = at;
    at += Align8(bytes);
    return here;
  };
  samples_at_ = take(kSamplesPerRow * g * sizeof(kernels::SampleRequest));
  logprobs_at_ = take(kSamplesPerRow * g * sizeof(kernels::LogprobRequest));
  token_ids_at_ = take(g * sizeof(int32_t));
  positions_at_ = take(g * sizeof(int32_t));
  slots_at_ = take(g * sizeof(int64_t));
  query_start_at_ = take(g * sizeof(int32_t));
  query_len_at_ = take(g * sizeof(int32_t));
  context_len_at_ = take(g * sizeof(int32_t));
  logit_rows_at_ = take(g * sizeof(int32_t));
  block_tables_at_ = take(g * options.max_blocks_per_seq * sizeof(int32_t));
  host_.assign(at, 0);
  device_ = kernels::Buffer<uint8_t>(backend, at);
}

bool DecodeGraphs::Fits(const ForwardBatch& b) const {
  const auto seqs = static_cast<int64_t>(b.query_start.size());
  if (seqs == 0 || seqs > options_.max_batch || !b.host_logit_rows.empty()) return false;
  if (static_cast<int64_t>(b.token_ids.size()) != seqs ||
      static_cast<int64_t>(b.logit_rows.size()) != seqs) {
    return false;
  }
  if (b.max_blocks_per_seq > options_.max_blocks_per_seq) return false;
  const int64_t room = kSamplesPerRow * options_.max_batch;
  if (static_cast<int64_t>(b.samples.size()) > room ||
      static_cast<int64_t>(b.logprobs.size()) > room) {
    return false;
  }
  for (int64_t s = 0; s < seqs; ++s) {
    if (b.query_len[s] != 1 || b.query_start[s] != s || b.logit_rows[s] != s) return false;
  }
  return true;
}

DecodeGraphs::Step DecodeGraphs::Prepare(const ForwardBatch& b, int64_t block_size,
                                         const void* cache_id) {
  if (cache_id != cache_id_) {
    Drop();
    cache_id_ = cache_id;
  }
  const auto seqs = static_cast<int64_t>(b.query_start.size());
  const int64_t batch = BatchBucket(seqs, options_.max_batch);
  const int64_t width = WidthBucket(b.max_blocks_per_seq, options_.max_blocks_per_seq);
  uint8_t* h = host_.data();
  auto host = [&](size_t at) { return h + at; };
  auto put = [&](size_t at, const auto& v) {
    if (!v.empty()) std::memcpy(host(at), v.data(), v.size() * sizeof(v[0]));
  };
  put(samples_at_, b.samples);
  put(logprobs_at_, b.logprobs);
  put(token_ids_at_, b.token_ids);
  put(positions_at_, b.positions);
  put(slots_at_, b.slot_mapping);
  put(query_start_at_, b.query_start);
  put(query_len_at_, b.query_len);
  put(context_len_at_, b.context_len);
  put(logit_rows_at_, b.logit_rows);
  // Padding rows: token 0 at position 0, no KV slot, no query token and no context.
  auto* token_ids = reinterpret_cast<int32_t*>(host(token_ids_at_));
  auto* positions = reinterpret_cast<int32_t*>(host(positions_at_));
  auto* slots = reinterpret_cast<int64_t*>(host(slots_at_));
  auto* query_start = reinterpret_cast<int32_t*>(host(query_start_at_));
  auto* query_len = reinterpret_cast<int32_t*>(host(query_len_at_));
  auto* context_len = reinterpret_cast<int32_t*>(host(context_len_at_));
  auto* logit_rows = reinterpret_cast<int32_t*>(host(logit_rows_at_));
  for (int64_t r = seqs; r < batch; ++r) {
    token_ids[r] = 0;
    positions[r] = 0;
    slots[r] = -1;
    query_start[r] = static_cast<int32_t>(r);
    query_len[r] = 0;
    context_len[r] = 0;
    logit_rows[r] = static_cast<int32_t>(r);
  }
  // Each sequence's table at the bucket's width; entries past its context are never read.
  auto* tables = reinterpret_cast<int32_t*>(host(block_tables_at_));
  const int64_t from = b.max_blocks_per_seq;
  for (int64_t s = 0; s < seqs; ++s) {
    std::memcpy(tables + s * width, b.block_tables.data() + s * from, from * sizeof(int32_t));
  }
  const size_t bytes = block_tables_at_ + static_cast<size_t>(batch * width) * sizeof(int32_t);
  backend_->Upload(device_.data(), h, bytes);

  const uint8_t* d = device_.data();
  Step step;
  StepInputs& in = step.inputs;
  in.token_ids = reinterpret_cast<const int32_t*>(d + token_ids_at_);
  in.positions = reinterpret_cast<const int32_t*>(d + positions_at_);
  in.slot_mapping = reinterpret_cast<const int64_t*>(d + slots_at_);
  in.query_start = reinterpret_cast<const int32_t*>(d + query_start_at_);
  in.query_len = reinterpret_cast<const int32_t*>(d + query_len_at_);
  in.context_len = reinterpret_cast<const int32_t*>(d + context_len_at_);
  in.block_tables = reinterpret_cast<const int32_t*>(d + block_tables_at_);
  in.logit_rows = reinterpret_cast<const int32_t*>(d + logit_rows_at_);
  in.tokens = in.num_seqs = in.num_logit_rows = batch;
  in.max_blocks_per_seq = width;
  in.max_query_len = 1;
  in.max_context_len = width * block_size;
  step.samples = reinterpret_cast<const kernels::SampleRequest*>(d + samples_at_);
  step.logprobs = reinterpret_cast<const kernels::LogprobRequest*>(d + logprobs_at_);
  step.bucket = {batch, width};
  return step;
}

DecodeGraphs::Recorded DecodeGraphs::Find(const Step& step) const {
  auto it = graphs_.find(step.bucket);
  return it == graphs_.end() ? Recorded{} : it->second;
}

void DecodeGraphs::MakeRoom() {
  if (graphs_.size() >= kMaxGraphs) Drop();
}

void DecodeGraphs::Drop() {
  graphs_.clear();
  backend_->DropGraphs();
  kept_.clear();
  stopped_ = absl::OkStatus();
}

}  // namespace kvserve::worker
