#include "worker/kv_cache/kv_staging.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"

namespace kvserve::worker {

KvStaging::KvStaging(KvStorage& device, kernels::Backend& backend)
    : device_(device), backend_(backend) {}

bool KvStaging::Direct() const { return backend_.name() == "cpu"; }

int KvStaging::staged_capacity() const { return staging_ ? staging_->num_blocks() : 0; }

KvStorage& KvStaging::Staging(int blocks) {
  if (!staging_ || staging_->num_blocks() < blocks) {
    const int n = std::max(blocks, 2 * staged_capacity());
    const kernels::KvCacheView v = device_.View(0);
    staging_.reset();  // the old pool's pinned memory goes first
    staging_ = std::make_unique<KvStorage>(device_.spec(), n, static_cast<int>(v.num_kv_heads),
                                           static_cast<int>(v.block_size),
                                           static_cast<int>(v.head_dim), &backend_,
                                           /*host_tier=*/true);
  }
  return *staging_;
}

void KvStaging::Copy(KvStorage& from, KvStorage& to, absl::Span<const int32_t> src,
                     absl::Span<const int32_t> dst) {
  const std::vector<kernels::KvCacheView> a = from.Views(), b = to.Views();
  backend_.CopyBlocks({.src_layers = a.data(),
                       .dst_layers = b.data(),
                       .num_layers = static_cast<int64_t>(a.size()),
                       .src = src.data(),
                       .dst = dst.data(),
                       .num_pairs = static_cast<int64_t>(src.size())});
  backend_.Synchronize();
}

absl::StatusOr<std::string> KvStaging::Encode(absl::Span<const int> blocks,
                                              absl::Span<const BlockHash> hashes) {
  if (Direct() || blocks.empty()) return EncodeBlocks(device_, backend_, blocks, hashes);
  for (int b : blocks) {
    if (b < 0 || b >= device_.num_blocks()) {
      return absl::InvalidArgumentError(
          absl::StrCat("block ", b, " is outside the pool of ", device_.num_blocks()));
    }
  }
  const int n = static_cast<int>(blocks.size());
  KvStorage& staging = Staging(n);
  std::vector<int32_t> src(blocks.begin(), blocks.end()), dst(n);
  std::iota(dst.begin(), dst.end(), 0);
  Copy(device_, staging, src, dst);
  return EncodeHostBlocks(staging, dst, hashes);
}

void KvStaging::Write(absl::Span<const WireBlock* const> blocks, absl::Span<const int> targets) {
  if (Direct() || blocks.empty()) {
    for (size_t i = 0; i < blocks.size(); ++i)
      WriteBlock(device_, backend_, targets[i], *blocks[i]);
    backend_.Synchronize();
    return;
  }
  const int n = static_cast<int>(blocks.size());
  KvStorage& staging = Staging(n);
  std::vector<int32_t> src(n), dst(targets.begin(), targets.end());
  std::iota(src.begin(), src.end(), 0);
  for (int i = 0; i < n; ++i) WriteHostBlock(staging, i, *blocks[i]);
  Copy(staging, device_, src, dst);
}

}  // namespace kvserve::worker
