#include "worker/kv_cache/kv_staging.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace kvserve::worker {

KvStaging::KvStaging(KvStorage& device, kernels::Backend& backend)
    : device_(device), backend_(backend) {}

bool KvStaging::Direct() const { return backend_.name() == "cpu"; }

int KvStaging::staged_capacity() const { return staging_ ? staging_->num_blocks() : 0; }

KvStorage& KvStaging::Grow(std::unique_ptr<KvStorage>& pool, int blocks, bool device) {
  if (!pool || pool->num_blocks() < blocks) {
    const int n = std::max(blocks, pool ? 2 * pool->num_blocks() : 0);
    const kernels::KvCacheView v = device_.View(0);
    pool.reset();  // the old pool's memory goes first
    pool = std::make_unique<KvStorage>(device_.spec(), n, static_cast<int>(v.num_kv_heads),
                                       static_cast<int>(v.block_size), static_cast<int>(v.head_dim),
                                       &backend_,
                                       /*host_tier=*/!device);
  }
  return *pool;
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

void KvStaging::Gather(absl::Span<const int> blocks, KvStorage& to) {
  std::vector<int32_t> src(blocks.begin(), blocks.end()), dst(blocks.size());
  std::iota(dst.begin(), dst.end(), 0);
  Copy(device_, to, src, dst);
}

absl::Status KvStaging::InPool(absl::Span<const int> blocks) const {
  for (int b : blocks) {
    if (b < 0 || b >= device_.num_blocks()) {
      return absl::InvalidArgumentError(
          absl::StrCat("block ", b, " is outside the pool of ", device_.num_blocks()));
    }
  }
  return absl::OkStatus();
}

absl::Status KvStaging::NeedsDevice() const {
  if (!Direct()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      "KV over a device link needs a device backend (the CPU's KV moves over the router)");
}

absl::StatusOr<std::string> KvStaging::Encode(absl::Span<const int> blocks,
                                              absl::Span<const BlockHash> hashes) {
  if (Direct() || blocks.empty()) return EncodeBlocks(device_, backend_, blocks, hashes);
  RETURN_IF_ERROR(InPool(blocks));
  const int n = static_cast<int>(blocks.size());
  KvStorage& staging = Grow(staging_, n, /*device=*/false);
  Gather(blocks, staging);
  std::vector<int> staged(n);
  std::iota(staged.begin(), staged.end(), 0);
  return EncodeHostBlocks(staging, staged, hashes);
}

void KvStaging::Write(absl::Span<const WireBlock* const> blocks, absl::Span<const int> targets) {
  if (Direct() || blocks.empty()) {
    for (size_t i = 0; i < blocks.size(); ++i)
      WriteBlock(device_, backend_, targets[i], *blocks[i]);
    backend_.Synchronize();
    return;
  }
  const int n = static_cast<int>(blocks.size());
  KvStorage& staging = Grow(staging_, n, /*device=*/false);
  std::vector<int32_t> src(n), dst(targets.begin(), targets.end());
  std::iota(src.begin(), src.end(), 0);
  for (int i = 0; i < n; ++i) WriteHostBlock(staging, i, *blocks[i]);
  Copy(staging, device_, src, dst);
}

absl::StatusOr<std::string> KvStaging::StageForLink(absl::Span<const int> blocks,
                                                    absl::Span<const BlockHash> hashes) {
  RETURN_IF_ERROR(NeedsDevice());
  if (blocks.size() != hashes.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(blocks.size(), " blocks and ", hashes.size(), " hashes"));
  }
  RETURN_IF_ERROR(InPool(blocks));
  const int n = static_cast<int>(blocks.size());
  KvStorage& staging = Grow(link_out_, std::max(n, 1), /*device=*/true);
  Gather(blocks, staging);
  staged_for_link_ = n;
  return EncodeLinkHeader(staging, hashes, backend_.Fingerprint(LeadingRanges(staging, n)));
}

absl::Status KvStaging::StartSendStaged(kernels::PeerLink& link) {
  if (!link_out_) return absl::FailedPreconditionError("nothing is staged for the link");
  return link.StartSend(LeadingRanges(*link_out_, staged_for_link_));
}

absl::Status KvStaging::ReceiveFromLink(kernels::PeerLink& link, const LinkHeader& header) {
  RETURN_IF_ERROR(NeedsDevice());
  const int n = static_cast<int>(header.hashes.size());
  KvStorage& staging = Grow(link_in_, std::max(n, 1), /*device=*/true);
  const std::vector<kernels::ByteRange> ranges = LeadingRanges(staging, n);
  backend_.Synchronize();  // nothing still reads the staging pool
  RETURN_IF_ERROR(link.Receive(ranges));
  if (const uint64_t got = backend_.Fingerprint(ranges); got != header.fingerprint) {
    return absl::DataLossError(absl::StrCat("KV over the link: the ", n,
                                            " blocks received have fingerprint ", got,
                                            ", the sender's header says ", header.fingerprint));
  }
  return absl::OkStatus();
}

void KvStaging::WriteReceived(absl::Span<const int> staged, absl::Span<const int> targets) {
  std::vector<int32_t> src(staged.begin(), staged.end()), dst(targets.begin(), targets.end());
  Copy(*link_in_, device_, src, dst);
}

}  // namespace kvserve::worker
